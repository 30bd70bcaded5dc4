//! The cost of one GeoIP lookup of a member at import: `bench/geoip_lookup.sh` runs this
//! under callgrind with two counts and divides the difference of the instructions by the
//! difference of the counts.
//!
//!     geoip_lookup LOOKUPS
//!
//! Writes a database of 10,000 single addresses (a search tree 32 levels deep, as deep as
//! a real file's for IPv4; records of GeoLite2's shape, country and autonomous system
//! together) and looks up LOOKUPS member ids naming those addresses, each as an import
//! does: the id parsed for its host, the file searched, the record decoded into labels.

/// The GeoIP tests' writer of database files.
#[path = "../tests/api/mmdb.rs"]
mod mmdb;

use proxy_allocator::domain::MemberId;
use proxy_allocator::geoip::GeoIp;

const ADDRESSES: u32 = 10_000;

fn main() {
    let lookups: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("usage: geoip_lookup LOOKUPS");
    // A fixed sequence of public-looking addresses (an LCG), the same in every run.
    let mut state = 0x2545_f491_u32;
    let mut addresses = Vec::new();
    let mut file = mmdb::Mmdb::default();
    for i in 0..ADDRESSES {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let ip = (state | 0x0100_0000).to_be_bytes();
        let country = ["DE", "FR", "NL", "US"][i as usize % 4];
        file = file.insert(
            ip,
            mmdb::record(country, 64_500 + i, "Example Networks GmbH"),
        );
        addresses.push(ip);
    }
    let path = std::env::temp_dir().join(format!("pa-geoip-bench-{}.mmdb", std::process::id()));
    std::fs::write(&path, file.build()).expect("written");
    let geo = GeoIp::open(&path);
    let members: Vec<MemberId> = addresses
        .iter()
        .map(|[a, b, c, d]| {
            MemberId::parse(&format!("http://{a}.{b}.{c}.{d}:8080")).expect("an id")
        })
        .collect();
    let mut labelled = 0usize;
    for member in members.iter().cycle().take(lookups) {
        labelled += geo
            .lookup_member(std::hint::black_box(member))
            .map_or(0, |labels| usize::from(!labels.is_empty()));
    }
    let _ = std::fs::remove_file(&path);
    println!("{lookups} lookups, {labelled} labelled");
}
