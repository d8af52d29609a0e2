//! The process table as drainit sees it: who its descendants are, read from `/proc`.
//!
//! Owns: finding every process drainit is responsible for (docs/processes-and-signals.md
//! "Descendants"): every process whose parent chain leads to drainit. As PID 1
//! that is every process of the PID namespace that the namespace's init adopted or
//! started; not PID 1, drainit is a child subreaper, so orphans of its tree are
//! re-parented to it and the chain never breaks. Daemons that called `setsid` or
//! double-forked are found too: process groups are not enough to find them.
//!
//! Must not: signal or wait for anything (only `tree.rs` kills, only
//! `reaper.rs` waits). Reading `/proc` is racy by nature; callers treat the result
//! as a snapshot.

use std::collections::{HashMap, HashSet};

/// One process, from `/proc/PID/stat`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    /// The kernel's 15-byte command name (`comm`), never the command line.
    pub comm: String,
    /// Start time in clock ticks since boot: with `pid`, a process's identity
    /// (a pid alone may be reused).
    pub start: u64,
    /// Exited but not yet reaped by its parent. A thread-group leader that exited
    /// while other threads of its process run on shows state `Z` too; that
    /// process is alive and is not a zombie here.
    pub zombie: bool,
    /// A zombie whose exit status says it was killed by SIGKILL (field 52,
    /// `exit_code`, Linux 3.5+): how drainit tells, after its SIGKILL, the
    /// processes it killed from those that had ended by themselves.
    pub killed: bool,
    /// Stopped by a signal (state `T`): it cannot act on a drain signal until
    /// it gets SIGCONT.
    pub stopped: bool,
}

impl Proc {
    /// `(pid, start)`: stable across pid reuse.
    pub fn id(&self) -> (i32, u64) {
        (self.pid, self.start)
    }
}

/// Parses the text of `/proc/PID/stat`. `comm` may hold spaces and parentheses, so
/// the fields after it are found from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<Proc> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let threads: u64 = rest.get(17)?.parse().ok()?;
    let zombie = matches!(rest.first()?.chars().next()?, 'Z' | 'X') && threads <= 1;
    let exit_code: i32 = rest.get(49).and_then(|c| c.parse().ok()).unwrap_or(0);
    Some(Proc {
        pid,
        comm,
        zombie,
        killed: zombie && exit_code & 0x7f == libc::SIGKILL,
        stopped: rest.first()?.starts_with('T'),
        ppid: rest.get(1)?.parse().ok()?,
        pgid: rest.get(2)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
    })
}

/// Whether a `/proc` read failed only because the process is gone (it exited
/// between the listing and the read): `ENOENT`, `ESRCH`.
fn vanished(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// One process's `/proc/PID/stat`, parsed; `None` when it is gone or unreadable.
pub fn stat_of(pid: i32) -> Option<Proc> {
    stat(&pid.to_string()).ok().flatten()
}

/// `/proc/PID/stat`, parsed; `Ok(None)` when the process is gone.
fn stat(pid: &str) -> std::io::Result<Option<Proc>> {
    match read_small(&format!("/proc/{pid}/stat")) {
        Ok(text) => Ok(parse_stat(&text)),
        Err(e) if vanished(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A small `/proc` file in one `read` where it fits (a `stat` line is a few
/// hundred bytes; procfs hands it out whole): four syscalls instead of
/// `read_to_string`'s ten, on the path of the forward at T0.
fn read_small(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = [0u8; 1024];
    let mut len = 0;
    loop {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len == buf.len() {
                    // Longer than expected: the rest the ordinary way.
                    let mut rest = buf.to_vec();
                    f.read_to_end(&mut rest)?;
                    return utf8(rest);
                }
                // procfs returns a seq_file record whole: a short read is the end.
                if len < buf.len() && buf[len - 1] == b'\n' {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    utf8(buf[..len].to_vec())
}

/// As `read_to_string` does: text that is not UTF-8 is an `InvalidData` error.
fn utf8(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Every process in this `/proc` (this PID namespace's view).
///
/// # Errors
/// `/proc` could not be read (out of file descriptors, no `/proc` mounted).
pub fn all() -> std::io::Result<Vec<Proc>> {
    let mut out = Vec::new();
    each(|p| out.push(p))?;
    Ok(out)
}

/// Calls `f` with every process of `/proc` as it is read.
fn each(mut f: impl FnMut(Proc)) -> std::io::Result<()> {
    for e in std::fs::read_dir("/proc")? {
        let name = e?.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(p) = stat(name)? {
            f(p);
        }
    }
    Ok(())
}

/// The live descendants of `root` (zombies excluded, but searched through), leaving
/// out the subtrees rooted at `exclude` (drainit's own helpers: exec checks and
/// teardown steps) and every process in a process group one of `exclude` leads
/// (what a helper left behind, re-parented to `root`).
///
/// Walks `/proc/PID/task/TID/children` from `root` down, so the cost follows the
/// size of drainit's tree, not of the host's process table (drainit not PID 1 on a
/// busy host); falls back to scanning all of `/proc` on kernels without
/// `CONFIG_PROC_CHILDREN`.
///
/// # Errors
/// `/proc` could not be read (`EMFILE`, …). Callers must then not conclude that no
/// descendant is left: an unreadable table is not an empty one.
pub fn descendants(root: i32, exclude: &HashSet<i32>) -> std::io::Result<Vec<Proc>> {
    let mut out = Vec::new();
    visit(root, exclude, |p| {
        if !p.zombie {
            out.push(p.clone());
        }
    })?;
    Ok(out)
}

/// Calls `f` with every descendant of `root` as it is found, zombies included
/// (but never searched through: a zombie's children were re-parented when it
/// exited), leaving out the subtrees at `exclude`. Not PID 1, the tree is
/// walked from `root` down, parents before their children, so a caller that
/// signals each process as it comes sends its first signal after one `/proc`
/// read, not after a walk of the whole tree. As PID 1 (`root` = 1), the whole
/// namespace is read (processes that entered it from outside have no parent
/// chain to walk): each process passed on as it is read when there is nothing
/// to leave out, else after the whole table.
///
/// # Errors
/// As [`descendants`].
pub fn visit(root: i32, exclude: &HashSet<i32>, f: impl FnMut(&Proc)) -> std::io::Result<()> {
    let mut f = f;
    if root == 1 {
        if exclude.is_empty() {
            // Nothing to leave out: each process as it is read, not after the
            // whole table (a caller may have a signal to send on the way).
            return each(|p| {
                if p.pid != 1 {
                    f(&p);
                }
            });
        }
        namespace(exclude)?.iter().for_each(&mut f);
        return Ok(());
    }
    if walk(root, exclude, &mut f)?.is_none() {
        let table = all()?;
        below(&table, root, exclude).into_iter().for_each(&mut f);
    }
    Ok(())
}

/// As PID 1: every live process of the PID namespace but PID 1 and the subtrees at
/// `exclude` (docs/processes-and-signals.md: as PID 1, every other process of the namespace is a
/// descendant, including those that entered it from outside with `nsenter` or
/// `docker exec`, whose parent is outside: `ppid` 0 here).
fn namespace(exclude: &HashSet<i32>) -> std::io::Result<Vec<Proc>> {
    let table = all()?;
    let mut skip: HashSet<i32> = exclude.clone();
    if !exclude.is_empty() {
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for p in &table {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        let mut stack: Vec<i32> = exclude.iter().copied().collect();
        while let Some(pid) = stack.pop() {
            for &c in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
                if skip.insert(c) {
                    stack.push(c);
                }
            }
        }
    }
    Ok(table
        .into_iter()
        .filter(|p| p.pid != 1 && !skip.contains(&p.pid) && !exclude.contains(&p.pgid))
        .collect())
}

/// Whether `p` is one of drainit's helpers or in a process group one leads
/// (a helper's leftover, re-parented to drainit): `exclude` holds both.
fn mine(exclude: &HashSet<i32>, p: &Proc) -> bool {
    exclude.contains(&p.pid) || exclude.contains(&p.pgid)
}

/// Whether `/proc` shows drainit's own PID namespace (`/proc/self` names this
/// process's pid). As PID 1 of a namespace whose `/proc` was not remounted
/// (`unshare --pid` without `--mount-proc`), `/proc` is the host's: its pids mean
/// nothing here, and signalling them could hit unrelated processes.
pub fn is_own_namespace() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// Whether any of `procs` entered the namespace from outside (parent outside the
/// namespace: `ppid` 0). Such a process raises no SIGCHLD in drainit when it ends.
pub fn any_from_outside(procs: &[Proc]) -> bool {
    procs.iter().any(|p| p.ppid == 0)
}

/// The pids listed in `/proc/PID/task/*/children` (every thread's children, zombies
/// included); `Ok(None)` when the kernel has no such file
/// (`CONFIG_PROC_CHILDREN`); an empty list when the process is gone.
///
/// For drainit's own pid this is exact where a walk is not: drainit's list of
/// children loses an entry only when drainit reaps it, so no entry can be skipped
/// while the file is read, and a process that exits leaves its zombie in the list
/// until then, with its own children already re-parented into the list.
///
/// # Errors
/// `/proc` could not be read.
pub fn children(pid: i32) -> std::io::Result<Option<Vec<i32>>> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) if vanished(&e) => return Ok(Some(Vec::new())),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    let mut any = false;
    for t in tasks {
        match std::fs::read_to_string(t?.path().join("children")) {
            Ok(text) => {
                any = true;
                out.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|w| w.parse::<i32>().ok()),
                );
            }
            Err(e) if vanished(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(any.then_some(out))
}

/// The walk behind [`visit`]; `Ok(None)` without `CONFIG_PROC_CHILDREN`.
fn walk(
    root: i32,
    exclude: &HashSet<i32>,
    f: &mut impl FnMut(&Proc),
) -> std::io::Result<Option<()>> {
    let Some(mut stack) = children(root)? else {
        return Ok(None);
    };
    let mut seen = HashSet::new();
    // A process that ends during the walk hands its children to `root` (the
    // subreaper, or PID 1), whose list may have been read before: read it again
    // after each pass until it holds nothing new (a forward at T0 kills the main
    // child while the walk runs; its children were missed, 1 drain in ~6 here).
    // Bounded: each further pass needs another death during the one before, and
    // at most MAX_PASSES: in an orphan storm every pass finds new zombies handed
    // over, and each re-read of a large list costs (~6 ms per 5,000 children).
    for _pass in 0..MAX_PASSES {
        while let Some(pid) = stack.pop() {
            if exclude.contains(&pid) || !seen.insert(pid) {
                continue;
            }
            // Gone or a zombie: its children (if any) were re-parented to
            // `root`, and the next pass finds them there.
            let Some(p) = stat(&pid.to_string())? else {
                continue;
            };
            if mine(exclude, &p) {
                continue;
            }
            f(&p);
            // A zombie has no children: they were re-parented when it exited. Not
            // reading them keeps a tree of many zombies (an app that never reaps)
            // at one read per zombie.
            if !p.zombie {
                stack.extend(children(pid)?.unwrap_or_default());
            }
        }
        stack = children(root)?
            .unwrap_or_default()
            .into_iter()
            .filter(|pid| !seen.contains(pid) && !exclude.contains(pid))
            .collect();
        if stack.is_empty() {
            break;
        }
    }
    Ok(Some(()))
}

/// At most this many passes of [`walk`] over `root`'s children (one re-read
/// finds what a death during the first pass handed over; more are for deaths
/// during those).
const MAX_PASSES: usize = 4;

/// [`descendants`] over a given table (for tests).
pub fn descendants_in(table: Vec<Proc>, root: i32, exclude: &HashSet<i32>) -> Vec<Proc> {
    below(&table, root, exclude)
        .into_iter()
        .filter(|p| !p.zombie)
        .cloned()
        .collect()
}

/// The processes of `table` below `root` by parent links (zombies included,
/// `root` and the subtrees at `exclude` left out), parents before children.
fn below<'a>(table: &'a [Proc], root: i32, exclude: &HashSet<i32>) -> Vec<&'a Proc> {
    let mut children: HashMap<i32, Vec<usize>> = HashMap::new();
    for (i, p) in table.iter().enumerate() {
        children.entry(p.ppid).or_default().push(i);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = HashSet::new();
    while let Some(pid) = stack.pop() {
        for &i in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            let p = &table[i];
            if p.pid == root || mine(exclude, p) || !seen.insert(p.pid) {
                continue;
            }
            stack.push(p.pid);
            out.push(p);
        }
    }
    out
}

/// The comm of one process, if it still exists.
pub fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_comm() {
        let line = "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 100 18446744073709551615";
        let p = parse_stat(line).unwrap();
        assert_eq!(
            (p.pid, p.ppid, p.pgid, p.start, p.zombie),
            (1234, 1, 1234, 98765, false)
        );
        assert_eq!(p.comm, "a (b) c");
        let z = parse_stat("9 (sh) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0").unwrap();
        assert!(z.zombie);
    }

    fn p(pid: i32, ppid: i32, zombie: bool) -> Proc {
        Proc {
            pid,
            ppid,
            pgid: pid,
            comm: format!("p{pid}"),
            start: 0,
            zombie,
            killed: false,
            stopped: false,
        }
    }

    #[test]
    fn walks_the_tree_through_zombies_and_skips_excluded_subtrees() {
        let table = vec![
            p(1, 0, false),
            p(10, 1, false),
            p(11, 10, true),
            p(12, 11, false),
            p(20, 1, false),
            p(21, 20, false),
            p(30, 5, false),
        ];
        let mut got: Vec<i32> = descendants_in(table.clone(), 1, &HashSet::new())
            .iter()
            .map(|p| p.pid)
            .collect();
        got.sort();
        assert_eq!(got, vec![10, 12, 20, 21]);
        let got: Vec<i32> = descendants_in(table, 1, &HashSet::from([20]))
            .iter()
            .map(|p| p.pid)
            .collect();
        assert!(!got.contains(&20) && !got.contains(&21));
    }

    #[test]
    fn what_a_helper_left_behind_is_left_out_once_re_parented() {
        // Helper 40 (its own group) was reaped; its `sleep` (41, group 40) was
        // re-parented to the root, beside the app (10).
        let leftover = Proc {
            pgid: 40,
            ..p(41, 1, false)
        };
        let table = vec![p(1, 0, false), p(10, 1, false), leftover];
        let got: Vec<i32> = descendants_in(table, 1, &HashSet::from([40]))
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(got, vec![10]);
    }

    #[test]
    fn this_proc_is_ours() {
        assert!(is_own_namespace());
    }

    #[test]
    fn reads_this_process_tree() {
        let me = std::process::id() as i32;
        assert!(all().unwrap().iter().any(|p| p.pid == me));
        // The walk and the full scan agree on a real tree.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let walked: Vec<i32> = descendants(me, &HashSet::new())
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        let scanned: Vec<i32> = descendants_in(all().unwrap(), me, &HashSet::new())
            .iter()
            .map(|p| p.pid)
            .collect();
        let _ = child.kill();
        assert!(
            walked.contains(&pid) && scanned.contains(&pid),
            "{walked:?} {scanned:?}"
        );
        #[allow(clippy::disallowed_methods)]
        let _ = child.wait();
    }
}
