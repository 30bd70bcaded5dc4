//! `exclude` of an assign: the members one call must not hand out, as if they were
//! ineligible for it (a retry that must move on to another member).

use std::collections::BTreeSet;

use super::{MemberId, canonical_member_id};

/// Most members one assign may exclude: a retry excludes what it already tried, and each
/// excluded member may cost the pick one more entry to look at.
pub const MAX_EXCLUDED: usize = 100;

/// The members an assign must not hand out, canonicalised (`1.2.3.4:8080` excludes
/// `http://1.2.3.4:8080`), each once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exclude(BTreeSet<MemberId>);

/// Why a value is not an [`Exclude`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidExclude {
    /// Not an array of strings.
    #[error("{field} is an array of member ids")]
    NotAList {
        /// The field's name.
        field: String,
    },
    /// More ids than [`MAX_EXCLUDED`].
    #[error("{field} names at most {MAX_EXCLUDED} members")]
    TooMany {
        /// The field's name.
        field: String,
    },
}

impl Exclude {
    /// Parses `field`'s value: an array of at most [`MAX_EXCLUDED`] strings (`null` is the
    /// field left out). A string that cannot be a member id names no member, so it excludes
    /// nothing; it is not an error, as a retry must never fail on what it was given back.
    ///
    /// # Errors
    /// [`InvalidExclude`] naming `field` for anything else.
    pub fn from_json(field: &str, value: &serde_json::Value) -> Result<Self, InvalidExclude> {
        let items = match value {
            serde_json::Value::Null => return Ok(Self::default()),
            serde_json::Value::Array(items) => items,
            _ => {
                return Err(InvalidExclude::NotAList {
                    field: field.to_owned(),
                });
            }
        };
        if items.len() > MAX_EXCLUDED {
            return Err(InvalidExclude::TooMany {
                field: field.to_owned(),
            });
        }
        let mut members = BTreeSet::new();
        for item in items {
            let serde_json::Value::String(text) = item else {
                return Err(InvalidExclude::NotAList {
                    field: field.to_owned(),
                });
            };
            if let Ok(member) = MemberId::parse(text) {
                members.insert(canonical_member_id(member));
            }
        }
        Ok(Self(members))
    }

    /// Excludes `members` (the first [`MAX_EXCLUDED`] of them).
    pub fn of(members: impl IntoIterator<Item = MemberId>) -> Self {
        Self(members.into_iter().take(MAX_EXCLUDED).collect())
    }

    /// Adds a member, unless [`MAX_EXCLUDED`] are already excluded.
    pub fn insert(&mut self, member: MemberId) {
        if self.0.len() < MAX_EXCLUDED {
            self.0.insert(member);
        }
    }

    /// Whether no member is excluded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many members are excluded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `member` is excluded.
    pub fn contains(&self, member: &MemberId) -> bool {
        self.0.contains(member)
    }

    /// The excluded members, in byte order.
    pub fn iter(&self) -> impl Iterator<Item = &MemberId> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(value: serde_json::Value) -> Result<Vec<String>, InvalidExclude> {
        Exclude::from_json("exclude", &value)
            .map(|e| e.iter().map(|m| m.as_str().to_owned()).collect())
    }

    #[test]
    fn addresses_are_canonicalised_and_kept_once() {
        assert_eq!(
            parsed(json!(["1.2.3.4:8080", "http://1.2.3.4:8080", "pool-a"])).expect("parsed"),
            vec!["http://1.2.3.4:8080".to_owned(), "pool-a".to_owned()]
        );
    }

    #[test]
    fn a_text_that_cannot_be_an_id_excludes_nothing() {
        assert_eq!(
            parsed(json!(["", "a b"])).expect("parsed"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_hundred_ids_are_taken_and_a_hundred_and_one_refused() {
        let ids =
            |n: usize| serde_json::Value::from((0..n).map(|i| format!("m{i}")).collect::<Vec<_>>());
        assert_eq!(parsed(ids(100)).expect("parsed").len(), 100);
        assert_eq!(
            parsed(ids(101)).expect_err("refused").to_string(),
            "exclude names at most 100 members"
        );
    }

    #[test]
    fn anything_but_an_array_of_strings_is_refused() {
        for value in [json!("m1"), json!([1]), json!({"m1": true})] {
            assert_eq!(
                parsed(value).expect_err("refused").to_string(),
                "exclude is an array of member ids"
            );
        }
        assert_eq!(parsed(json!(null)).expect("parsed"), Vec::<String>::new());
    }
}
