//! A tiny writer of MaxMind DB files (the `.mmdb` format of GeoLite2 and GeoIP2, as the
//! public MaxMind DB File Format Specification 2.0 describes it), for the GeoIP tests: an
//! IPv4 search tree with 24-bit records whose leaves are single addresses, a data section
//! of maps, strings and unsigned integers, and the metadata section. Enough for the
//! `maxminddb` crate to read what the service reads; no more.

use std::net::Ipv4Addr;

use serde_json::Value;

/// A database under construction: addresses with their records.
#[derive(Default)]
pub struct Mmdb {
    entries: Vec<(Ipv4Addr, Value)>,
}

/// One record of a search-tree node: another node, nothing, or data at an offset of the
/// data section.
#[derive(Clone, Copy)]
enum Link {
    Node(usize),
    Empty,
    Data(usize),
}

impl Mmdb {
    /// `ip` (alone, a /32) maps to `record` (a JSON object of strings, numbers and
    /// objects, as GeoLite2's records are).
    pub fn insert(mut self, ip: [u8; 4], record: Value) -> Self {
        self.entries.push((Ipv4Addr::from(ip), record));
        self
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut data = Vec::new();
        let mut nodes: Vec<[Link; 2]> = vec![[Link::Empty, Link::Empty]];
        for (ip, record) in &self.entries {
            let offset = data.len();
            encode(&mut data, record);
            let bits = u32::from(*ip);
            let mut node = 0;
            for depth in 0..32 {
                let bit = usize::from(bits >> (31 - depth) & 1 == 1);
                if depth == 31 {
                    nodes[node][bit] = Link::Data(offset);
                    break;
                }
                node = match nodes[node][bit] {
                    Link::Node(next) => next,
                    _ => {
                        nodes.push([Link::Empty, Link::Empty]);
                        let next = nodes.len() - 1;
                        nodes[node][bit] = Link::Node(next);
                        next
                    }
                };
            }
        }
        let count = nodes.len();
        let mut file = Vec::new();
        for node in &nodes {
            for link in node {
                let value = match *link {
                    Link::Node(next) => next,
                    Link::Empty => count,
                    // Data pointers count from the start of the tree's 16-byte separator.
                    Link::Data(offset) => count + 16 + offset,
                };
                let value = u32::try_from(value).expect("fits 24 bits");
                file.extend_from_slice(&value.to_be_bytes()[1..]);
            }
        }
        file.extend_from_slice(&[0; 16]);
        file.extend_from_slice(&data);
        file.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
        let metadata = serde_json::json!({
            "binary_format_major_version": {"u16": 2},
            "binary_format_minor_version": {"u16": 0},
            "build_epoch": {"u64": 1_700_000_000u64},
            "database_type": "proxy-allocator-test",
            "description": {"en": "addresses of the GeoIP tests"},
            "ip_version": {"u16": 4},
            "languages": ["en"],
            "node_count": {"u32": count},
            "record_size": {"u16": 24},
        });
        encode(&mut file, &metadata);
        file
    }
}

/// A control byte (and the extended-type byte and size bytes after it) for a field of
/// `kind` (1 to 15) and `size`.
fn control(out: &mut Vec<u8>, kind: u8, size: usize) {
    let (short, extra): (u8, Vec<u8>) = match size {
        0..=28 => (u8::try_from(size).expect("small"), Vec::new()),
        29..=284 => (29, vec![u8::try_from(size - 29).expect("one byte")]),
        _ => {
            let rest = u16::try_from(size - 285).expect("two bytes");
            (30, rest.to_be_bytes().to_vec())
        }
    };
    if kind <= 7 {
        out.push(kind << 5 | short);
    } else {
        out.push(short);
        out.push(kind - 7);
    }
    out.extend_from_slice(&extra);
}

/// An unsigned integer of `kind` (5: uint16, 6: uint32, 9: uint64) in as few bytes as it
/// needs.
fn unsigned(out: &mut Vec<u8>, kind: u8, value: u64) {
    let bytes = value.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    control(out, kind, 8 - skip);
    out.extend_from_slice(&bytes[skip..]);
}

/// `value` in the data section's encoding: strings as UTF-8 strings, numbers as uint32 (or
/// uint64 when larger), arrays as arrays, objects as maps, except the objects `{"u16": n}`,
/// `{"u32": n}` and `{"u64": n}`, which are that type.
fn encode(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(text) => {
            control(out, 2, text.len());
            out.extend_from_slice(text.as_bytes());
        }
        Value::Number(n) => {
            let n = n.as_u64().expect("unsigned");
            unsigned(out, if n > u64::from(u32::MAX) { 9 } else { 6 }, n);
        }
        Value::Array(items) => {
            control(out, 11, items.len());
            for item in items {
                encode(out, item);
            }
        }
        Value::Object(map) => {
            if let [(kind, Value::Number(n))] = map.iter().collect::<Vec<_>>().as_slice() {
                let code = match kind.as_str() {
                    "u16" => Some(5),
                    "u32" => Some(6),
                    "u64" => Some(9),
                    _ => None,
                };
                if let Some(code) = code {
                    return unsigned(out, code, n.as_u64().expect("unsigned"));
                }
            }
            control(out, 7, map.len());
            for (key, item) in map {
                control(out, 2, key.len());
                out.extend_from_slice(key.as_bytes());
                encode(out, item);
            }
        }
        Value::Bool(_) | Value::Null => panic!("not used by the tests: {value}"),
    }
}

/// A GeoLite2-like record: a country (ISO code) and an autonomous system.
pub fn record(country: &str, asn: u32, org: &str) -> Value {
    serde_json::json!({
        "country": {"iso_code": country, "names": {"en": "a country"}},
        "autonomous_system_number": asn,
        "autonomous_system_organization": org,
    })
}

#[test]
fn the_reader_the_service_uses_reads_what_this_writes() {
    let bytes = Mmdb::default()
        .insert([127, 0, 0, 2], record("DE", 64500, "Example Net"))
        .insert([127, 0, 0, 3], record("FR", 64501, "Other"))
        .build();
    let reader = maxminddb::Reader::from_source(bytes).expect("a valid database");
    let found: Value = reader
        .lookup([127, 0, 0, 3].into())
        .expect("looked up")
        .decode()
        .expect("decoded")
        .expect("listed");
    assert_eq!(found, record("FR", 64501, "Other"));
    let missing: Option<Value> = reader
        .lookup([127, 0, 0, 4].into())
        .expect("looked up")
        .decode()
        .expect("decoded");
    assert_eq!(missing, None);
}
