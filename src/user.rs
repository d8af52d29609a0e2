//! `--user USER[:GROUP]`: who the child runs as (the gosu / su-exec step of an
//! entrypoint, done by the init itself).
//!
//! Owns: turning `USER[:GROUP]` into ids by reading the image's `/etc/passwd` and
//! `/etc/group` directly, never through NSS: a static binary has no NSS, a
//! `FROM scratch` image has no `nsswitch.conf`, and a lookup must never wait on a
//! directory service. Numeric ids always work, with or without the files.
//!
//! Must not: change drainit's own ids. Only the child switches, in `spawn`,
//! between `clone` and `execve`; drainit keeps running as it started, so it can
//! still signal and reap whatever the child becomes.
//!
//! The rules are su-exec's (and gosu's): with `USER` alone, the group is the
//! user's primary group from `/etc/passwd` and the supplementary groups are every
//! `/etc/group` entry that lists the user (`initgroups(3)`); with `USER:GROUP`,
//! the group is `GROUP` and it is the only one. A numeric uid with no passwd entry
//! keeps drainit's own gid (Docker's `--user 1000` rule) unless `:GROUP` is given.
//! `HOME` is set to the passwd entry's home directory, `/` without one.

use std::path::Path;

/// Whom the child runs as, resolved before anything starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// As given (`nobody`, `1000:1000`, `app:www-data`), for messages.
    pub spec: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`setgroups(2)`), `gid` included; never empty.
    pub groups: Vec<u32>,
    /// The child's `HOME`: the passwd entry's directory, or `/`.
    pub home: String,
}

/// Why `--user` could not be resolved.
#[derive(Debug, PartialEq, Eq)]
pub enum UserError {
    /// The value is malformed (empty user or group, more than one `:`).
    Syntax(String),
    /// A name is not in the image's files (or they cannot be read).
    Unknown(String),
}

struct Passwd {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

struct Group {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// The entries of a colon-separated database with at least `fields` fields;
/// comments, blank and malformed lines (and NIS `+`/`-` lines) are skipped, as
/// the C libraries' files backends skip them.
fn entries(text: &str, fields: usize) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(move |f| f.len() >= fields && !f[0].is_empty())
}

/// An id field of an entry: decimal, and never `u32::MAX` ((uid_t)-1 means "no
/// change" to setresuid(2)/setresgid(2): an entry with it would leave the child
/// running as drainit, root). Such an entry is skipped as malformed.
fn id_field(s: &str) -> Option<u32> {
    s.parse().ok().filter(|n| *n != u32::MAX)
}

fn parse_passwd(text: &str) -> Vec<Passwd> {
    entries(text, 7)
        .filter_map(|f| {
            Some(Passwd {
                name: f[0].to_string(),
                uid: id_field(f[2])?,
                gid: id_field(f[3])?,
                home: f[5].to_string(),
            })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<Group> {
    entries(text, 4)
        .filter_map(|f| {
            Some(Group {
                name: f[0].to_string(),
                gid: id_field(f[2])?,
                members: f[3]
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect(),
            })
        })
        .collect()
}

fn numeric(s: &str) -> Option<u32> {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // u32::MAX is (uid_t)-1, "no change" to setresuid(2): refused.
        s.parse().ok().filter(|n| *n != u32::MAX)
    } else {
        None
    }
}

/// The largest `passwd` or `group` file read, bytes.
const MAX_DB_FILE: u64 = 16 * 1024 * 1024;

/// Reads `etc/NAME`; a file that is missing or unreadable reads as empty, with
/// the reason kept for the error a name lookup may need. Only a regular file of
/// at most [`MAX_DB_FILE`] is read, opened non-blocking (a fifo planted by a
/// hostile image must not hang drainit's start with every signal blocked). Bytes
/// that are not UTF-8 (a GECOS field in Latin-1) are read lossily: they cannot be
/// in a name given on the command line anyway.
fn read(etc: &Path, name: &str) -> (String, Option<String>) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read = || -> std::io::Result<Result<String, String>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(etc.join(name))?;
        if !file.metadata()?.is_file() {
            return Ok(Err("not a regular file".into()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_DB_FILE + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_DB_FILE {
            return Ok(Err(format!("larger than {} MiB", MAX_DB_FILE >> 20)));
        }
        Ok(Ok(String::from_utf8_lossy(&bytes).into_owned()))
    };
    match read() {
        Ok(Ok(t)) => (t, None),
        Ok(Err(why)) => (String::new(), Some(why)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            (String::new(), Some("missing".into()))
        }
        Err(e) => (String::new(), Some(e.kind().to_string())),
    }
}

/// Resolves `USER[:GROUP]` against the `passwd` and `group` files in `etc`
/// (`/etc` in drainit; a test folder in tests). `own_gid` is the group kept for a
/// numeric uid with no passwd entry and no `:GROUP`.
///
/// # Errors
/// [`UserError::Syntax`] for a malformed value, [`UserError::Unknown`] naming the
/// user or group not found and the file searched.
pub fn resolve(spec: &str, etc: &Path, own_gid: u32) -> Result<Identity, UserError> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() {
        return Err(UserError::Syntax(format!(
            "'{spec}' has no user (USER or USER:GROUP, names or numbers)"
        )));
    }
    if group.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(UserError::Syntax(format!(
            "'{spec}' is not USER:GROUP (names or numbers)"
        )));
    }
    let (passwd_text, passwd_why) = read(etc, "passwd");
    let passwd = parse_passwd(&passwd_text);
    let shown = |file: &str, why: &Option<String>| match why {
        Some(w) => format!("{}/{file} ({w})", etc.display()),
        None => format!("{}/{file}", etc.display()),
    };
    let entry = match numeric(user) {
        Some(uid) => passwd.iter().find(|p| p.uid == uid),
        None => Some(passwd.iter().find(|p| p.name == user).ok_or_else(|| {
            UserError::Unknown(format!(
                "user '{user}' not found in {}",
                shown("passwd", &passwd_why)
            ))
        })?),
    };
    let uid = numeric(user)
        .or(entry.map(|p| p.uid))
        .expect("a user is numeric or was found by name");
    let home = entry.map_or_else(|| "/".to_string(), |p| p.home.clone());
    let home = if home.is_empty() { "/".into() } else { home };

    let groups_of = || {
        let (t, why) = read(etc, "group");
        (parse_group(&t), why)
    };
    let (gid, groups) = match group {
        Some(g) => {
            let gid = match numeric(g) {
                Some(n) => n,
                None => {
                    let (all, why) = groups_of();
                    all.iter()
                        .find(|e| e.name == g)
                        .map(|e| e.gid)
                        .ok_or_else(|| {
                            UserError::Unknown(format!(
                                "group '{g}' not found in {}",
                                shown("group", &why)
                            ))
                        })?
                }
            };
            (gid, vec![gid])
        }
        None => match entry {
            Some(p) => {
                let mut groups = vec![p.gid];
                for e in groups_of().0 {
                    if e.members.contains(&p.name) && !groups.contains(&e.gid) {
                        groups.push(e.gid);
                    }
                }
                (p.gid, groups)
            }
            None => (own_gid, vec![own_gid]),
        },
    };
    Ok(Identity {
        spec: spec.to_string(),
        uid,
        gid,
        groups,
        home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("drainit-user-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("passwd"),
            "# comment\nroot:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nbroken:x:zz:1::/:\n",
        )
        .unwrap();
        std::fs::write(
            d.join("group"),
            "root:x:0:\napp:x:1000:\nwww-data:x:33:app\nvideo:x:44:other, app\nnogroup:x:65534:\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn names_resolve_with_initgroups_rules() {
        let d = etc("names");
        let id = resolve("app", &d, 0).unwrap();
        assert_eq!(
            (id.uid, id.gid, id.home.as_str()),
            (1000, 1000, "/home/app")
        );
        assert_eq!(id.groups, vec![1000, 33, 44]);
        // An explicit group is the only one.
        let id = resolve("app:www-data", &d, 0).unwrap();
        assert_eq!((id.uid, id.gid, id.groups), (1000, 33, vec![33]));
        // A numeric uid with an entry gets its name's groups and home.
        let id = resolve("1000", &d, 0).unwrap();
        assert_eq!(
            (id.gid, id.groups.len(), id.home.as_str()),
            (1000, 3, "/home/app")
        );
    }

    #[test]
    fn numbers_always_work() {
        let d = etc("numbers");
        let id = resolve("4242:4343", &d, 0).unwrap();
        assert_eq!(
            (id.uid, id.gid, id.groups, id.home),
            (4242, 4343, vec![4343], "/".into())
        );
        // No entry, no group: drainit's own gid (Docker's rule).
        let id = resolve("4242", &d, 7).unwrap();
        assert_eq!((id.gid, id.groups), (7, vec![7]));
        // Without any file at all.
        let none = Path::new("/nonexistent-etc");
        assert_eq!(resolve("5:6", none, 0).unwrap().uid, 5);
    }

    #[test]
    fn unknown_and_malformed_values_are_refused() {
        let d = etc("bad");
        assert!(
            matches!(resolve("ghost", &d, 0), Err(UserError::Unknown(m)) if m.contains("user 'ghost' not found in"))
        );
        assert!(
            matches!(resolve("app:ghosts", &d, 0), Err(UserError::Unknown(m)) if m.contains("group 'ghosts'"))
        );
        assert!(matches!(
            resolve("broken", &d, 0),
            Err(UserError::Unknown(_))
        ));
        let none = Path::new("/nonexistent-etc");
        assert!(
            matches!(resolve("app", none, 0), Err(UserError::Unknown(m)) if m.contains("passwd (missing)"))
        );
        for bad in ["", ":1", "app:", "a:b:c"] {
            assert!(
                matches!(resolve(bad, &d, 0), Err(UserError::Syntax(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            resolve("4294967295", &d, 0),
            Err(UserError::Unknown(_))
        ));
    }

    /// Review findings: an entry whose uid or gid is (uid_t)-1 ("no change" to
    /// setresuid) never resolves (the child would stay root); one Latin-1 byte
    /// elsewhere in the file does not break every lookup; a fifo in place of the
    /// file is refused at once instead of hanging.
    #[test]
    fn hostile_databases_never_leave_the_child_root_nor_hang() {
        let d = etc("hostile");
        let mut pw = std::fs::read(d.join("passwd")).unwrap();
        pw.extend_from_slice(b"evil:x:4294967295:4294967295::/tmp:/bin/sh\n");
        pw.extend_from_slice(b"lat:x:1001:1001:Ren\xe9:/tmp:/bin/sh\n");
        std::fs::write(d.join("passwd"), pw).unwrap();
        let mut gr = std::fs::read(d.join("group")).unwrap();
        gr.extend_from_slice(b"evilg:x:4294967295:\n");
        std::fs::write(d.join("group"), gr).unwrap();
        assert!(matches!(resolve("evil", &d, 0), Err(UserError::Unknown(_))));
        assert!(matches!(
            resolve("evil:0", &d, 0),
            Err(UserError::Unknown(_))
        ));
        assert!(matches!(
            resolve("app:evilg", &d, 0),
            Err(UserError::Unknown(_))
        ));
        assert_eq!(resolve("nobody", &d, 0).unwrap().uid, 65534);
        assert_eq!(resolve("lat", &d, 0).unwrap().uid, 1001);

        let f = etc("fifo");
        std::fs::remove_file(f.join("passwd")).unwrap();
        nix::unistd::mkfifo(&f.join("passwd"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let started = std::time::Instant::now();
        assert!(
            matches!(resolve("app", &f, 0), Err(UserError::Unknown(m)) if m.contains("not a regular file"))
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
