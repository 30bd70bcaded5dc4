//! What keeping the embedded store's stream of updates costs in an append-only log (the
//! format the service uses: checksummed frames, one durable write per interval), in redb and
//! in fjall. 1,000,000 keys; ten intervals of UPDATES random-key count updates (default
//! 100,000, the assigns of one second), each interval one durable commit. Prints the commit's
//! wall time and CPU, the bytes the disk received per update, and the time to read the whole
//! state back into memory.
use redb::ReadableTable;
use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

const KEYS: usize = 1_000_000;

fn key(i: usize) -> String {
    format!("http://proxy-{i:07}.example.net:3128")
}

fn io_write_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
fn thread_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

fn main() {
    let which = std::env::args().nth(1).unwrap();
    let updates: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(100_000);
    let rounds = 10;
    let dir = std::env::temp_dir().join(format!("persistence-bench-{which}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    let mut counts = vec![0u64; KEYS];
    let plan: Vec<Vec<usize>> = (0..rounds)
        .map(|_| (0..updates).map(|_| rand::random_range(0..KEYS)).collect())
        .collect();
    let t = Instant::now();
    // Load
    match which.as_str() {
        "log" => {
            let mut f = std::fs::File::create(dir.join("log")).unwrap();
            let mut buf = Vec::new();
            for k in &keys {
                rec(&mut buf, k, 0);
            }
            frame(&mut f, &buf);
        }
        "redb" => {
            let db = redb::Database::create(dir.join("db")).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(TABLE).unwrap();
                for k in &keys {
                    t.insert(k.as_str(), 0u64).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        "fjall" => {
            let ks = fjall::Config::new(dir.join("fj")).open().unwrap();
            let p = ks.open_partition("m", Default::default()).unwrap();
            let mut b = ks.batch();
            for k in &keys {
                b.insert(&p, k.as_bytes(), 0u64.to_le_bytes());
            }
            b.commit().unwrap();
            ks.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        _ => panic!(),
    }
    eprintln!("{which}: loaded 1M in {:?}", t.elapsed());
    let w0 = io_write_bytes();
    let mut walls = vec![];
    let mut cpus = vec![];
    {
        let db = (which == "redb").then(|| redb::Database::create(dir.join("db")).unwrap());
        let fj = (which == "fjall").then(|| {
            let ks = fjall::Config::new(dir.join("fj")).open().unwrap();
            let p = ks.open_partition("m", Default::default()).unwrap();
            (ks, p)
        });
        let mut logf = (which == "log").then(|| {
            std::fs::OpenOptions::new()
                .append(true)
                .open(dir.join("log"))
                .unwrap()
        });
        for round in &plan {
            let c0 = thread_cpu();
            let t0 = Instant::now();
            match which.as_str() {
                "log" => {
                    let mut buf = Vec::with_capacity(updates * 48);
                    for &i in round {
                        counts[i] += 1;
                        rec(&mut buf, &keys[i], counts[i]);
                    }
                    frame(logf.as_mut().unwrap(), &buf);
                }
                "redb" => {
                    let tx = db.as_ref().unwrap().begin_write().unwrap();
                    {
                        let mut t = tx.open_table(TABLE).unwrap();
                        for &i in round {
                            counts[i] += 1;
                            t.insert(keys[i].as_str(), counts[i]).unwrap();
                        }
                    }
                    tx.commit().unwrap();
                }
                "fjall" => {
                    let (ks, p) = fj.as_ref().unwrap();
                    let mut b = ks.batch();
                    for &i in round {
                        counts[i] += 1;
                        b.insert(p, keys[i].as_bytes(), counts[i].to_le_bytes());
                    }
                    b.commit().unwrap();
                    ks.persist(fjall::PersistMode::SyncData).unwrap();
                }
                _ => unreachable!(),
            }
            walls.push(t0.elapsed().as_secs_f64());
            cpus.push(thread_cpu() - c0);
        }
    }
    let written = io_write_bytes() - w0;
    walls.sort_by(|a, b| a.partial_cmp(b).unwrap());
    cpus.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // Recovery
    let t = Instant::now();
    let mut state: HashMap<String, u64> = HashMap::with_capacity(KEYS);
    match which.as_str() {
        "log" => {
            let data = std::fs::read(dir.join("log")).unwrap();
            let mut at = 0;
            while at < data.len() {
                let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
                let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap());
                let p = &data[at + 8..at + 8 + len];
                assert_eq!(crc32c::crc32c(p), crc);
                let mut q = 0;
                while q < p.len() {
                    let kl = p[q] as usize;
                    let k = std::str::from_utf8(&p[q + 1..q + 1 + kl]).unwrap();
                    q += 1 + kl;
                    let v = u64::from_le_bytes(p[q..q + 8].try_into().unwrap());
                    q += 8;
                    match state.get_mut(k) {
                        Some(s) => *s = v,
                        None => {
                            state.insert(k.to_owned(), v);
                        }
                    }
                }
                at += 8 + len;
            }
        }
        "redb" => {
            let db = redb::Database::create(dir.join("db")).unwrap();
            let tx = db.begin_read().unwrap();
            let t = tx.open_table(TABLE).unwrap();
            for r in t.iter().unwrap() {
                let (k, v) = r.unwrap();
                state.insert(k.value().to_owned(), v.value());
            }
        }
        "fjall" => {
            let ks = fjall::Config::new(dir.join("fj")).open().unwrap();
            let p = ks.open_partition("m", Default::default()).unwrap();
            for r in p.iter() {
                let (k, v) = r.unwrap();
                state.insert(
                    String::from_utf8(k.to_vec()).unwrap(),
                    u64::from_le_bytes(v[..8].try_into().unwrap()),
                );
            }
        }
        _ => unreachable!(),
    }
    let recovery = t.elapsed();
    assert!(
        state
            .iter()
            .all(|(k, v)| *v == counts[k[13..20].parse::<usize>().unwrap()])
    );
    let size: u64 = walk(&dir);
    println!(
        "{which}: {updates} updates/interval at 1M keys: commit wall median {:.1} ms (max {:.1}), CPU median {:.1} ms; disk written {:.1} bytes/update; recovery (read all 1M) {:.2} s; on disk {:.1} MB",
        walls[rounds / 2] * 1e3,
        walls[rounds - 1] * 1e3,
        cpus[rounds / 2] * 1e3,
        written as f64 / (updates * rounds) as f64,
        recovery.as_secs_f64(),
        size as f64 / 1e6
    );
    let _ = std::fs::remove_dir_all(&dir);
}
const TABLE: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("m");
fn rec(buf: &mut Vec<u8>, k: &str, v: u64) {
    buf.push(k.len() as u8);
    buf.extend_from_slice(k.as_bytes());
    buf.extend_from_slice(&v.to_le_bytes());
}
fn frame(f: &mut std::fs::File, p: &[u8]) {
    let mut h = Vec::with_capacity(8 + p.len());
    h.extend_from_slice(&(p.len() as u32).to_le_bytes());
    h.extend_from_slice(&crc32c::crc32c(p).to_le_bytes());
    h.extend_from_slice(p);
    f.write_all(&h).unwrap();
    f.sync_data().unwrap();
}
fn walk(d: &std::path::Path) -> u64 {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() { walk(&e.path()) } else { m.len() }
        })
        .sum()
}
