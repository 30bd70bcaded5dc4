//! The files of a data directory: their names, their headers, and the checksummed frames
//! records travel in.
//!
//! ```text
//! LOCK                 held (flock) by the one process that has the directory open
//! snapshot.000007      every pool as of the start of log.000007 (see `snapshot.rs`)
//! log.000007           what operations changed since; appended to
//! log.000008           the next generation, once a compaction has begun
//! ```
//!
//! A log or snapshot file is a 16-byte header (8 bytes of magic, the generation as a
//! little-endian u64) and then frames:
//!
//! ```text
//! len: u32 LE | header_crc: u32 LE = crc32c(len) | payload_crc: u32 LE = crc32c(payload) | payload
//! ```
//!
//! A frame holds whole operations (a log frame is what one flush wrote) or a chunk of a
//! snapshot, so dropping a frame drops whole operations. The header has its own checksum
//! so that a flipped bit in a length is seen as corruption rather than taken for a frame
//! cut off by a crash.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use super::OpenError;

/// Magic of a log file.
pub(super) const LOG_MAGIC: [u8; 8] = *b"PALOG\0\0\x01";
/// Magic of a snapshot file.
pub(super) const SNAPSHOT_MAGIC: [u8; 8] = *b"PASNAP\0\x01";
/// Bytes before the first frame.
pub(super) const FILE_HEADER: u64 = 16;
/// Bytes of a frame before its payload.
pub(super) const FRAME_HEADER: usize = 12;
/// Largest payload a frame may declare; a larger length is corruption.
const MAX_FRAME: u32 = 1 << 30;

/// The lock file's name.
pub(super) const LOCK: &str = "LOCK";

/// A file the directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    Log(u64),
    Snapshot(u64),
    /// A snapshot still being written, or abandoned by a crash.
    SnapshotInProgress(u64),
}

pub(super) fn log_name(generation: u64) -> String {
    format!("log.{generation:06}")
}

pub(super) fn snapshot_name(generation: u64) -> String {
    format!("snapshot.{generation:06}")
}

pub(super) fn snapshot_in_progress_name(generation: u64) -> String {
    format!("snapshot.{generation:06}.partial")
}

/// What a file name says it is; `None` for names the store did not write.
pub(super) fn kind_of(name: &str) -> Option<Kind> {
    let generation = |digits: &str| {
        (digits.len() >= 6 && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse().ok())
            .flatten()
    };
    if let Some(rest) = name.strip_prefix("log.") {
        return generation(rest).map(Kind::Log);
    }
    let rest = name.strip_prefix("snapshot.")?;
    match rest.strip_suffix(".partial") {
        Some(digits) => generation(digits).map(Kind::SnapshotInProgress),
        None => generation(rest).map(Kind::Snapshot),
    }
}

/// A file header.
pub(super) fn file_header(magic: [u8; 8], generation: u64) -> [u8; FILE_HEADER as usize] {
    let mut header = [0u8; FILE_HEADER as usize];
    header[..8].copy_from_slice(&magic);
    header[8..].copy_from_slice(&generation.to_le_bytes());
    header
}

/// Appends `payload` to `out` as one frame.
pub(super) fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    // Frames are cut well below 4 GiB: a flush or a snapshot chunk is megabytes.
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc32c::crc32c(&len).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// How a file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// After a whole frame.
    Clean,
    /// In a frame cut short by a crash: the valid part ends at `offset`, and `dropped`
    /// bytes follow it.
    Torn { offset: u64, dropped: u64 },
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> OpenError {
    OpenError::Corrupt {
        path: path.to_owned(),
        offset,
        reason: reason.into(),
    }
}

/// Reads every frame of `path`, handing each payload and its frame's offset to `each`.
///
/// A frame cut short at the end of the file is the trace of a crash in the middle of a
/// write: with `torn_allowed` (the last log) it is reported as [`End::Torn`]; anywhere
/// else, and any checksum failure that is not at the very end, is corruption.
pub(super) fn read_frames(
    path: &Path,
    magic: [u8; 8],
    generation: u64,
    torn_allowed: bool,
    mut each: impl FnMut(&[u8], u64) -> Result<(), OpenError>,
) -> Result<End, OpenError> {
    let file = File::open(path).map_err(io_error(path))?;
    let length = file.metadata().map_err(io_error(path))?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; FILE_HEADER as usize];
    if length < FILE_HEADER {
        return Err(corrupt(path, 0, "shorter than its header"));
    }
    reader.read_exact(&mut header).map_err(io_error(path))?;
    if header != file_header(magic, generation) {
        return Err(corrupt(
            path,
            0,
            "not a file of this store, or of another generation",
        ));
    }
    let mut offset = FILE_HEADER;
    let mut payload = Vec::new();
    let torn = |offset: u64, why: &str| {
        if torn_allowed {
            Ok(End::Torn {
                offset,
                dropped: length - offset,
            })
        } else {
            Err(corrupt(
                path,
                offset,
                format!("{why}, and only the last log may end in a torn write"),
            ))
        }
    };
    while offset < length {
        let remaining = length - offset;
        if remaining < FRAME_HEADER as u64 {
            return torn(offset, "a frame header cut short");
        }
        let mut head = [0u8; FRAME_HEADER];
        reader.read_exact(&mut head).map_err(io_error(path))?;
        let [l0, l1, l2, l3, h0, h1, h2, h3, p0, p1, p2, p3] = head;
        let len_bytes = [l0, l1, l2, l3];
        if crc32c::crc32c(&len_bytes) != u32::from_le_bytes([h0, h1, h2, h3]) {
            // A crash can leave a zero-filled tail (space the file system allotted but the
            // data never reached); anything else is damage.
            if head.iter().all(|&b| b == 0) && rest_is_zero(&mut reader).map_err(io_error(path))? {
                return torn(offset, "a zero-filled tail");
            }
            return Err(corrupt(path, offset, "frame header checksum mismatch"));
        }
        let len = u32::from_le_bytes(len_bytes);
        if len > MAX_FRAME {
            return Err(corrupt(
                path,
                offset,
                "frame longer than any this store writes",
            ));
        }
        if u64::from(len) > remaining - FRAME_HEADER as u64 {
            return torn(offset, "a frame cut short");
        }
        payload.resize(len as usize, 0);
        reader.read_exact(&mut payload).map_err(io_error(path))?;
        let end = offset + FRAME_HEADER as u64 + u64::from(len);
        if crc32c::crc32c(&payload) != u32::from_le_bytes([p0, p1, p2, p3]) {
            // The last frame of the file may have been written only in part before a
            // power loss; a mismatch anywhere before it is damage.
            if end == length {
                return torn(offset, "a last frame whose checksum does not match");
            }
            return Err(corrupt(path, offset, "frame checksum mismatch"));
        }
        each(&payload, offset)?;
        offset = end;
    }
    Ok(End::Clean)
}

fn rest_is_zero(reader: &mut impl Read) -> io::Result<bool> {
    let mut chunk = [0u8; 8192];
    loop {
        let n = reader.read(&mut chunk)?;
        if n == 0 {
            return Ok(true);
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Makes a directory's entries (new, renamed and removed files) durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The path of `name` in `dir`.
pub(super) fn path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("pa-files-{:016x}", rand::random::<u64>()));
            std::fs::create_dir_all(&dir).expect("a directory");
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A log of generation 1 with frames holding `payloads`.
    fn log(dir: &Dir, payloads: &[&[u8]]) -> (PathBuf, Vec<u8>) {
        let mut bytes = file_header(LOG_MAGIC, 1).to_vec();
        for payload in payloads {
            frame(&mut bytes, payload);
        }
        let path = dir.0.join(log_name(1));
        std::fs::write(&path, &bytes).expect("written");
        (path, bytes)
    }

    /// Each frame's payload with its offset.
    type Frames = Vec<(Vec<u8>, u64)>;

    fn read(path: &Path, torn_allowed: bool) -> (Result<End, OpenError>, Frames) {
        let mut frames = Vec::new();
        let end = read_frames(path, LOG_MAGIC, 1, torn_allowed, |payload, offset| {
            frames.push((payload.to_vec(), offset));
            Ok(())
        });
        (end, frames)
    }

    fn corruption_offset(result: Result<End, OpenError>) -> u64 {
        match result {
            Err(OpenError::Corrupt { offset, .. }) => offset,
            other => panic!("corruption expected, got {other:?}"),
        }
    }

    #[test]
    fn names_say_what_a_file_is() {
        assert_eq!(kind_of(&log_name(7)), Some(Kind::Log(7)));
        assert_eq!(
            kind_of(&snapshot_name(1234567)),
            Some(Kind::Snapshot(1234567))
        );
        assert_eq!(
            kind_of(&snapshot_in_progress_name(8)),
            Some(Kind::SnapshotInProgress(8))
        );
        for other in [
            "LOCK",
            "log.1",
            "log.00000x",
            "snapshot.000001.tmp",
            "lost+found",
        ] {
            assert_eq!(kind_of(other), None, "{other}");
        }
    }

    #[test]
    fn frames_read_back_with_their_offsets() {
        let dir = Dir::new();
        let (path, _) = log(&dir, &[b"one", b"", b"three"]);
        let (end, frames) = read(&path, false);
        assert_eq!(end.expect("clean"), End::Clean);
        assert_eq!(
            frames,
            [
                (b"one".to_vec(), 16),
                (Vec::new(), 16 + 12 + 3),
                (b"three".to_vec(), 16 + 12 + 3 + 12)
            ]
        );
    }

    #[test]
    fn a_last_frame_cut_at_any_byte_is_torn_and_the_frames_before_it_are_kept() {
        let dir = Dir::new();
        let (path, bytes) = log(&dir, &[b"kept", b"the last one"]);
        let last = 16 + 12 + 4;
        for cut in last + 1..bytes.len() {
            std::fs::write(&path, &bytes[..cut]).expect("written");
            let (end, frames) = read(&path, true);
            assert_eq!(
                end.expect("torn, not corrupt"),
                End::Torn {
                    offset: last as u64,
                    dropped: (cut - last) as u64
                },
                "cut at {cut}"
            );
            assert_eq!(frames, [(b"kept".to_vec(), 16)], "cut at {cut}");
            // Anywhere but in the last log it is corruption.
            assert_eq!(corruption_offset(read(&path, false).0), last as u64);
        }
    }

    #[test]
    fn a_zero_filled_tail_is_torn() {
        let dir = Dir::new();
        let (path, mut bytes) = log(&dir, &[b"kept"]);
        bytes.extend_from_slice(&[0; 100]);
        std::fs::write(&path, &bytes).expect("written");
        assert_eq!(
            read(&path, true).0.expect("torn"),
            End::Torn {
                offset: 32,
                dropped: 100
            }
        );
    }

    #[test]
    fn a_flipped_byte_before_the_last_frame_is_corruption_at_its_frame() {
        let dir = Dir::new();
        let (path, bytes) = log(&dir, &[b"first", b"second", b"third"]);
        let second = 16 + 12 + 5;
        let third = second + 12 + 6;
        // Every byte of the first two frames, header and payload alike: a flipped length
        // must not pass for a torn tail.
        for at in 16..third {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            std::fs::write(&path, &damaged).expect("written");
            let frame = if at < second { 16 } else { second };
            assert_eq!(
                corruption_offset(read(&path, true).0),
                frame as u64,
                "byte {at} flipped"
            );
        }
    }

    #[test]
    fn a_file_of_another_kind_or_generation_is_refused() {
        let dir = Dir::new();
        let (path, _) = log(&dir, &[b"x"]);
        let other = read_frames(&path, SNAPSHOT_MAGIC, 1, true, |_, _| Ok(()));
        assert_eq!(corruption_offset(other), 0);
        let other = read_frames(&path, LOG_MAGIC, 2, true, |_, _| Ok(()));
        assert_eq!(corruption_offset(other), 0);
    }
}
