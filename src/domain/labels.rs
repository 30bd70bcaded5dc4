//! Member labels (`country=de`, `provider=acme`) and the label filters an assign or a
//! listing asks for, parsed at the edge.
//!
//! Keys are `[a-z0-9_.-]{1,32}` and values `[A-Za-z0-9_.:-]{1,64}`: neither holds `=`,
//! `,`, a space or a control byte, which is what lets the stores write a label as
//! `key=value` and a filter group as `key value value ...` without escaping.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most labels one member carries.
pub const MAX_LABELS: usize = 16;
/// Most labels a store keeps for one member: the operator's and those from the GeoIP file
/// (`geo_country`, `geo_asn`, `geo_org`).
pub const MAX_STORED_LABELS: usize = MAX_LABELS + 3;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY_LEN: usize = 32;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_LEN: usize = 64;
/// Most values one key of a filter may list.
pub const MAX_FILTER_VALUES: usize = 16;

/// Why labels or a filter were refused: the field, and what it must be. Answered as 400
/// `invalid_request` with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {what}")]
pub struct InvalidLabels {
    /// The field, as the caller wrote it (`labels`, `members[3].labels.country`, `label`).
    pub field: String,
    /// What it must be.
    pub what: String,
}

impl InvalidLabels {
    fn new(field: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            what: what.into(),
        }
    }
}

/// The prefix of the label keys the service gives members from its GeoIP file
/// (`geo_country`, `geo_asn`, `geo_org`): operators cannot set them, filters may name them.
pub const GEO_PREFIX: &str = "geo_";

const GEO_RULE: &str = "label keys starting with geo_ are given by the service from its GeoIP file";

const KEY_RULE: &str = "a label key is 1 to 32 characters of a-z, 0-9, '_', '.' and '-'";
const VALUE_RULE: &str =
    "a label value is 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-'";

fn valid_key(key: &str) -> bool {
    (1..=MAX_LABEL_KEY_LEN).contains(&key.len())
        && key
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-'))
}

fn valid_value(value: &str) -> bool {
    (1..=MAX_LABEL_VALUE_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

fn check_key(field: &str, key: &str) -> Result<(), InvalidLabels> {
    if valid_key(key) {
        Ok(())
    } else {
        Err(InvalidLabels::new(field, KEY_RULE))
    }
}

fn check_value(field: &str, value: &str) -> Result<(), InvalidLabels> {
    if valid_value(value) {
        Ok(())
    } else {
        Err(InvalidLabels::new(field, VALUE_RULE))
    }
}

/// A member's labels: at most [`MAX_LABELS`] keys, each with one value, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    /// Parses a JSON object of string values found at `field`.
    ///
    /// # Errors
    /// [`InvalidLabels`] naming the field (or the key within it) that breaks a rule.
    pub fn from_json(field: &str, value: &Value) -> Result<Self, InvalidLabels> {
        let Value::Object(map) = value else {
            return Err(InvalidLabels::new(
                field,
                "labels are an object of key: value strings",
            ));
        };
        if map.len() > MAX_LABELS {
            return Err(InvalidLabels::new(
                field,
                format!("a member carries at most {MAX_LABELS} labels"),
            ));
        }
        let mut labels = BTreeMap::new();
        for (key, value) in map {
            check_key(field, key)?;
            check_not_geo(field, key)?;
            let inner = format!("{field}.{key}");
            let Value::String(value) = value else {
                return Err(InvalidLabels::new(inner, "a label value is a string"));
            };
            check_value(&inner, value)?;
            labels.insert(key.clone(), value.clone());
        }
        Ok(Self(labels))
    }

    /// Parses `key=value` pairs (query parameters named `field`); a key given twice keeps
    /// its last value.
    ///
    /// # Errors
    /// [`InvalidLabels`] naming `field` when a pair is malformed or there are too many.
    pub fn from_pairs<'a>(
        field: &str,
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, InvalidLabels> {
        let mut labels = BTreeMap::new();
        for pair in pairs {
            let (key, value) = split_pair(field, pair)?;
            check_not_geo(field, key)?;
            labels.insert(key.to_owned(), value.to_owned());
        }
        if labels.len() > MAX_LABELS {
            return Err(InvalidLabels::new(
                field,
                format!("a member carries at most {MAX_LABELS} labels"),
            ));
        }
        Ok(Self(labels))
    }

    /// Labels the service made from its GeoIP file: each key starts with [`GEO_PREFIX`];
    /// a pair that breaks a rule is left out.
    pub fn from_geo<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> Self {
        Self(
            pairs
                .into_iter()
                .filter(|(key, value)| {
                    key.starts_with(GEO_PREFIX) && valid_key(key) && valid_value(value)
                })
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        )
    }

    /// Splits labels a store kept into the operator's and those from the GeoIP file.
    pub fn split_geo(self) -> (Self, Self) {
        let (geo, operator) = self
            .0
            .into_iter()
            .partition(|(key, _)| key.starts_with(GEO_PREFIX));
        (Self(operator), Self(geo))
    }

    /// Whether the operator's `country` differs from the GeoIP file's `geo_country`
    /// (compared without case: `DE` is `de`). False unless both are there.
    pub fn country_mismatch(&self) -> bool {
        match (self.get("country"), self.get("geo_country")) {
            (Some(mine), Some(geo)) => !mine.eq_ignore_ascii_case(geo),
            _ => false,
        }
    }

    /// These labels with `other`'s added (`other`'s value wins for a key in both).
    pub fn merged(&self, other: &Self) -> Self {
        let mut all = self.0.clone();
        all.extend(other.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self(all)
    }

    /// Rebuilds labels a store kept, from [`Labels::script_text`]. Pairs that do not follow
    /// the rules are dropped: only this service writes the text.
    pub fn from_script_text(text: &str) -> Self {
        Self(
            text.split('\n')
                .filter_map(|pair| pair.split_once('='))
                .filter(|(key, value)| valid_key(key) && valid_value(value))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect(),
        )
    }

    /// The labels as `key=value` lines, in key order: how the Redis store keeps them.
    pub fn script_text(&self) -> String {
        self.pairs().collect::<Vec<_>>().join("\n")
    }

    /// Each label as `key=value`, in key order.
    pub fn pairs(&self) -> impl Iterator<Item = String> + '_ {
        self.0.iter().map(|(key, value)| format!("{key}={value}"))
    }

    /// The value of `key`, when the member carries it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each `(key, value)`, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether these labels pass `filter`: for every key of the filter, the member's value
    /// is one of the filter's values.
    pub fn matches(&self, filter: &LabelFilter) -> bool {
        filter.groups.iter().all(|(key, values)| {
            self.get(key)
                .is_some_and(|mine| values.iter().any(|v| v == mine))
        })
    }
}

fn check_not_geo(field: &str, key: &str) -> Result<(), InvalidLabels> {
    if key.starts_with(GEO_PREFIX) {
        Err(InvalidLabels::new(field, GEO_RULE))
    } else {
        Ok(())
    }
}

fn split_pair<'a>(field: &str, pair: &'a str) -> Result<(&'a str, &'a str), InvalidLabels> {
    let (key, value) = pair
        .split_once('=')
        .ok_or_else(|| InvalidLabels::new(field, "a label is given as key=value"))?;
    check_key(field, key)?;
    check_value(field, value)?;
    Ok((key, value))
}

/// What an assign or a listing asks of members' labels: for every key, the member's value
/// is one of the listed ones. Empty means no condition. Keys in order, values de-duplicated
/// in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelFilter {
    groups: Vec<(String, Vec<String>)>,
}

impl LabelFilter {
    /// Parses `key=value` query parameters named `field`; a key given twice accepts either
    /// value.
    ///
    /// # Errors
    /// [`InvalidLabels`] naming `field` when a pair is malformed or there are too many.
    pub fn from_pairs<'a>(
        field: &str,
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, InvalidLabels> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pair in pairs {
            let (key, value) = split_pair(field, pair)?;
            let values = groups.entry(key.to_owned()).or_default();
            if !values.iter().any(|v| v == value) {
                values.push(value.to_owned());
            }
            if values.len() > MAX_FILTER_VALUES {
                return Err(InvalidLabels::new(
                    field,
                    format!("a filter lists 1 to {MAX_FILTER_VALUES} values per key"),
                ));
            }
        }
        if groups.len() > MAX_LABELS {
            return Err(InvalidLabels::new(
                field,
                format!("a filter names at most {MAX_LABELS} keys"),
            ));
        }
        Ok(Self {
            groups: groups.into_iter().collect(),
        })
    }

    /// Whether it asks nothing.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Each key with the values it accepts, in key order.
    pub fn groups(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.groups.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Each group as one script argument, `key value value ...`.
    pub fn script_args(&self) -> Vec<String> {
        self.groups
            .iter()
            .map(|(key, values)| {
                let mut arg = key.clone();
                for value in values {
                    arg.push(' ');
                    arg.push_str(value);
                }
                arg
            })
            .collect()
    }
}

/// An assign's `{"key": "value" | ["v1", "v2"]}` as the body gave it, read straight from
/// the JSON (no `serde_json::Value` tree in between): the keys with what each lists, checked
/// by [`FilterField::filter`]. Reading it never fails on what the field holds, so that a
/// filter breaking a rule is answered as 400 `invalid_request` naming the field, as every
/// label rule is, and not as a JSON error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilterField {
    /// Whether the field is an object at all.
    object: bool,
    /// Each key with what it lists, in the body's order.
    keys: Vec<(String, Listed)>,
}

/// What one key of a filter lists; `None` for an item that is not a string.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listed {
    One(Option<String>),
    Several(Vec<Option<String>>),
}

impl FilterField {
    /// The filter, the field being `field`.
    ///
    /// # Errors
    /// [`InvalidLabels`] naming the field (or key) that breaks a rule.
    pub fn filter(self, field: &str) -> Result<LabelFilter, InvalidLabels> {
        if !self.object {
            return Err(InvalidLabels::new(
                field,
                "labels are an object of key: value or key: [values]",
            ));
        }
        let mut keys = self.keys;
        // As a JSON object is read: in key order, a key given twice with its last value.
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        if keys.len() > MAX_LABELS {
            return Err(InvalidLabels::new(
                field,
                format!("a filter names at most {MAX_LABELS} keys"),
            ));
        }
        // The field's name for an error is made only for an error: this runs on every
        // labelled assign.
        let mut groups = Vec::with_capacity(keys.len());
        for (key, listed) in keys {
            check_key(field, &key)?;
            let inner = || format!("{field}.{key}");
            let checked = |value: Option<String>| match value {
                None => Err(InvalidLabels::new(inner(), "a label value is a string")),
                Some(value) if !valid_value(&value) => Err(InvalidLabels::new(inner(), VALUE_RULE)),
                Some(value) => Ok(value),
            };
            let kept = match listed {
                // The common filter, one value: kept as it was read.
                Listed::One(value) => vec![checked(value)?],
                Listed::Several(values) => {
                    if values.is_empty() || values.len() > MAX_FILTER_VALUES {
                        return Err(InvalidLabels::new(
                            inner(),
                            format!("a filter lists 1 to {MAX_FILTER_VALUES} values per key"),
                        ));
                    }
                    let mut kept: Vec<String> = Vec::with_capacity(values.len());
                    for value in values {
                        let value = checked(value)?;
                        if !kept.contains(&value) {
                            kept.push(value);
                        }
                    }
                    kept
                }
            };
            groups.push((key, kept));
        }
        Ok(LabelFilter { groups })
    }
}

impl<'de> Deserialize<'de> for FilterField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FieldVisitor)
    }
}

/// Reads a filter field: an object of keys, or anything else (kept as not an object).
struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = FilterField;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a label filter")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FilterField, A::Error> {
        let mut keys = Vec::with_capacity(map.size_hint().unwrap_or(1).min(MAX_LABELS));
        while let Some(key) = map.next_key::<String>()? {
            keys.push((key, map.next_value::<Listed>()?));
        }
        Ok(FilterField { object: true, keys })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FilterField, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(FilterField::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<FilterField, E> {
        Ok(FilterField::default())
    }
}

impl<'de> Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListedVisitor;

        impl<'de> Visitor<'de> for ListedVisitor {
            type Value = Listed;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a label value or a list of them")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Listed, A::Error> {
                let mut values =
                    Vec::with_capacity(seq.size_hint().unwrap_or(1).min(MAX_FILTER_VALUES + 1));
                while let Some(Item(value)) = seq.next_element()? {
                    values.push(value);
                }
                Ok(Listed::Several(values))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Listed, A::Error> {
                Item::drain_map(map).map(|Item(value)| Listed::One(value))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Listed, E> {
                Ok(Listed::One(Some(value.to_owned())))
            }

            fn visit_string<E: de::Error>(self, value: String) -> Result<Listed, E> {
                Ok(Listed::One(Some(value)))
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Listed, E> {
                Ok(Listed::One(None))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Listed, E> {
                Ok(Listed::One(None))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Listed, E> {
                Ok(Listed::One(None))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Listed, E> {
                Ok(Listed::One(None))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Listed, E> {
                Ok(Listed::One(None))
            }
        }

        deserializer.deserialize_any(ListedVisitor)
    }
}

/// One item of a list of values: the string, or `None` for anything else.
struct Item(Option<String>);

impl Item {
    fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self(None))
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;

        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a label value")
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Item, E> {
                Ok(Item(Some(value.to_owned())))
            }

            fn visit_string<E: de::Error>(self, value: String) -> Result<Item, E> {
                Ok(Item(Some(value)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Item(None))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                Item::drain_map(map)
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Item, E> {
                Ok(Item(None))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Item, E> {
                Ok(Item(None))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Item, E> {
                Ok(Item(None))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Item, E> {
                Ok(Item(None))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Item, E> {
                Ok(Item(None))
            }
        }

        deserializer.deserialize_any(ItemVisitor)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn labels_name_the_field_and_key_that_break_a_rule() {
        let err = Labels::from_json("members[1].labels", &json!({"Country": "de"}))
            .expect_err("upper-case key");
        assert_eq!(err.field, "members[1].labels");
        let err = Labels::from_json("labels", &json!({"country": "d e"})).expect_err("space");
        assert_eq!(err.to_string(), format!("labels.country: {VALUE_RULE}"));
        let err = Labels::from_json("labels", &json!({"country": 1})).expect_err("number");
        assert_eq!(err.field, "labels.country");
        let many: serde_json::Map<String, Value> =
            (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let err = Labels::from_json("labels", &Value::Object(many)).expect_err("17 labels");
        assert_eq!(err.what, "a member carries at most 16 labels");
        let long_key = "k".repeat(33);
        assert!(Labels::from_json("labels", &json!({ long_key: "v" })).is_err());
        let long_value = "v".repeat(65);
        assert!(Labels::from_json("labels", &json!({"k": long_value})).is_err());
        let edge = Labels::from_json(
            "labels",
            &json!({ "k".repeat(32): "V:.-_9".repeat(10) + "abcd" }),
        );
        assert!(edge.is_ok());
    }

    #[test]
    fn labels_round_trip_through_the_script_text_in_key_order() {
        let labels =
            Labels::from_json("labels", &json!({"provider": "acme", "country": "de"})).expect("ok");
        assert_eq!(labels.script_text(), "country=de\nprovider=acme");
        assert_eq!(Labels::from_script_text(&labels.script_text()), labels);
        assert_eq!(Labels::from_script_text(""), Labels::default());
    }

    /// The filter read from `value` as an assign's `labels` field is read.
    fn filter_of(value: Value) -> Result<LabelFilter, InvalidLabels> {
        let field: FilterField = serde_json::from_value(value).expect("any JSON is read");
        field.filter("labels")
    }

    #[test]
    fn a_filter_field_keeps_a_key_s_last_value_and_names_the_field_or_key_that_breaks_a_rule() {
        let read = |body: &str| {
            serde_json::from_str::<FilterField>(body)
                .expect("any JSON is read")
                .filter("labels")
        };
        let filter = read(r#"{"tier": "a", "country": "fr", "country": ["de", "us", "de"]}"#);
        assert_eq!(
            filter.expect("ok").script_args(),
            ["country de us", "tier a"]
        );
        let many = (0..17)
            .map(|i| format!(r#""k{i}": "v""#))
            .collect::<Vec<_>>()
            .join(", ");
        let not_a_string = "a label value is a string";
        let listing = "a filter lists 1 to 16 values per key";
        for (body, error) in [
            (
                r#""de""#,
                "labels: labels are an object of key: value or key: [values]",
            ),
            (
                r#"["de"]"#,
                "labels: labels are an object of key: value or key: [values]",
            ),
            (
                "7",
                "labels: labels are an object of key: value or key: [values]",
            ),
            (
                r#"{"country": 7}"#,
                &format!("labels.country: {not_a_string}"),
            ),
            (
                r#"{"country": null}"#,
                &format!("labels.country: {not_a_string}"),
            ),
            (
                r#"{"country": ["de", null]}"#,
                &format!("labels.country: {not_a_string}"),
            ),
            (
                r#"{"country": {"de": 1}}"#,
                &format!("labels.country: {not_a_string}"),
            ),
            (
                r#"{"country": [["de"]]}"#,
                &format!("labels.country: {not_a_string}"),
            ),
            (r#"{"country": []}"#, &format!("labels.country: {listing}")),
            (
                r#"{"country": ["d e", 7]}"#,
                &format!("labels.country: {VALUE_RULE}"),
            ),
            (
                r#"{"Country": "de", "c": 7}"#,
                &format!("labels: {KEY_RULE}"),
            ),
            (
                &format!("{{{many}}}"),
                "labels: a filter names at most 16 keys",
            ),
        ] {
            assert_eq!(read(body).expect_err(body).to_string(), error, "{body}");
        }
    }

    #[test]
    fn a_filter_takes_a_value_or_a_list_and_matches_every_key() {
        let filter = filter_of(json!({"country": ["de", "fr", "de"], "tier": "a"})).expect("ok");
        assert_eq!(filter.script_args(), ["country de fr", "tier a"]);
        let member = |country: &str| {
            Labels::from_pairs("label", [format!("country={country}").as_str(), "tier=a"])
                .expect("ok")
        };
        assert!(member("fr").matches(&filter));
        assert!(!member("us").matches(&filter));
        let err = filter_of(json!({"country": []})).expect_err("empty");
        assert_eq!(err.field, "labels.country");
        let err = LabelFilter::from_pairs("label", ["country"]).expect_err("no =");
        assert_eq!(err.field, "label");
    }
}
