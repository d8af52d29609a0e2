//! Small helpers shared by several modules: durations in log lines, an optional
//! deadline to sleep until, I/O errors as a word, a listener with a deep accept
//! queue, a counter keyed by label in a small vector.
//!
//! Must not: hold state or depend on another drainit module (it sits at the bottom
//! of the module graph).

// Shared with the admission proxy, a crate of its own (proxy/) that imports
// nothing from drainit: they live there and are used here under these names.
pub use drainit_proxy::util::{bind_listener, fmt_ms};

/// The value for `key` in a small list of label sets (in the order first seen),
/// inserted as `V::default()` when new. A vector, not a map: each holds a handful
/// of entries (signals, checks, paths), and every map type would add its own
/// code to the binary.
pub fn entry<K: PartialEq, V: Default>(v: &mut Vec<(K, V)>, key: K) -> &mut V {
    let i = match v.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            v.push((key, V::default()));
            v.len() - 1
        }
    };
    &mut v[i].1
}

/// Sleeps until `deadline`; with `None`, never returns (a `select!` arm that is
/// disabled without a branch of its own).
pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The kind of an I/O error as a word for messages and the report: `not found`,
/// `permission denied`, `address in use`, `address not available`, `exec format
/// error` (a script without `#!` in the musl build), `is a directory`; `None` for
/// any other error, whose caller picks the fallback (its text where that is safe
/// to show, a fixed word where it is not: the report never carries an error's
/// text).
pub fn io_word(e: &std::io::Error) -> Option<&'static str> {
    use std::io::ErrorKind;
    match (e.kind(), e.raw_os_error()) {
        (ErrorKind::NotFound, _) => Some("not found"),
        (ErrorKind::PermissionDenied, _) => Some("permission denied"),
        (ErrorKind::AddrInUse, _) => Some("address in use"),
        (ErrorKind::AddrNotAvailable, _) => Some("address not available"),
        (_, Some(libc::ENOEXEC)) => Some("exec format error"),
        (_, Some(libc::EISDIR)) => Some("is a directory"),
        _ => None,
    }
}

/// [`io_word`], or else the error's own text (for start-up errors printed to the
/// operator, never for the report or a probe).
pub fn io_word_or_text(e: &std::io::Error) -> String {
    io_word(e).map_or_else(|| e.to_string(), String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_word_names_the_kinds_and_nothing_else() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(io_word(&e(libc::ENOENT)), Some("not found"));
        assert_eq!(io_word(&e(libc::EACCES)), Some("permission denied"));
        assert_eq!(io_word(&e(libc::EADDRINUSE)), Some("address in use"));
        assert_eq!(io_word(&e(libc::ENOEXEC)), Some("exec format error"));
        assert_eq!(io_word(&e(libc::EISDIR)), Some("is a directory"));
        assert_eq!(io_word(&e(libc::EAGAIN)), None);
        assert_eq!(io_word(&e(libc::EIO)), None);
        assert!(io_word_or_text(&e(libc::EIO)).contains("Input/output error"));
    }
}
