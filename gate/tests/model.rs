//! The model's rules (docs/gate.md): one row per scenario of docs/gate.md's "What the
//! seed scenarios give" (and a few more), then the invariants as
//! property tests over random settings.

use drainit_gate::model::{Event, ExitCause, Run, Settings, Status, run};
use proptest::prelude::*;

fn ids(r: &Run, status: Status) -> Vec<u32> {
    r.requests
        .iter()
        .filter(|q| q.status == status)
        .map(|q| q.id)
        .collect()
}

/// A scenario of the seed: its settings and the ledger it gives.
struct Row {
    what: &'static str,
    settings: Settings,
    /// committed, rejected, failed, killed
    ledger: [u32; 4],
    rejected: &'static [u32],
    failed: &'static [u32],
    killed: &'static [u32],
    pass: bool,
}

fn opening() -> Settings {
    Settings::default()
}

fn row(
    what: &'static str,
    change: impl FnOnce(&mut Settings),
    ledger: [u32; 4],
    lists: (&'static [u32], &'static [u32], &'static [u32]),
    pass: bool,
) -> Row {
    let mut settings = opening();
    change(&mut settings);
    Row {
        what,
        settings,
        ledger,
        rejected: lists.0,
        failed: lists.1,
        killed: lists.2,
        pass,
    }
}

/// The scenarios of docs/gate.md's "What the seed scenarios give", then a few more.
fn seed_rows() -> Vec<Row> {
    let mut rows = opening_rows();
    rows.extend(more_rows());
    rows
}

/// The first half of the table: the opening settings and their nearest neighbours.
fn opening_rows() -> Vec<Row> {
    vec![
        row(
            "the opening settings: 15/4/0/1, gate fails",
            |_| {},
            [15, 4, 0, 1],
            (&[1, 2, 17, 19], &[], &[15]),
            false,
        ),
        row(
            "cold start without route_ready: #1 and #2 fail with 500, no allowance excuses them",
            |s| s.route_ready = false,
            [15, 2, 2, 1],
            (&[17, 19], &[1, 2], &[15]),
            false,
        ),
        row(
            "cold start, route_ready false, even with every 503 allowed: the failures fail it",
            |s| {
                s.route_ready = false;
                s.allow_503_pct = 100;
                s.grace_s = 10;
            },
            [16, 2, 2, 0],
            (&[17, 19], &[1, 2], &[]),
            false,
        ),
        row(
            "startup 0: #1 and #2 run; the rejections and the kill come from the shutdown",
            |s| s.startup_s = 0,
            [17, 2, 0, 1],
            (&[17, 19], &[], &[15]),
            false,
        ),
        row(
            "startup 0, grace 6: #15 ends at the kill's second and commits",
            |s| {
                s.startup_s = 0;
                s.grace_s = 6;
            },
            [18, 2, 0, 0],
            (&[17, 19], &[], &[]),
            false,
        ),
        row(
            "startup 0, grace 7: more than enough",
            |s| {
                s.startup_s = 0;
                s.grace_s = 7;
            },
            [18, 2, 0, 0],
            (&[17, 19], &[], &[]),
            false,
        ),
        row(
            "startup 0, grace 10",
            |s| {
                s.startup_s = 0;
                s.grace_s = 10;
            },
            [18, 2, 0, 0],
            (&[17, 19], &[], &[]),
            false,
        ),
        row(
            "startup 0, W1 does not handle TERM: it exits at the signal, killing #13 and #15",
            |s| {
                s.startup_s = 0;
                s.handles_term = false;
            },
            [16, 2, 0, 2],
            (&[17, 19], &[], &[13, 15]),
            false,
        ),
        row(
            "startup 0, duration 12: even a 10 s grace period kills one",
            |s| {
                s.startup_s = 0;
                s.duration_s = 12;
                s.grace_s = 10;
            },
            [12, 7, 0, 1],
            (&[5, 6, 11, 12, 17, 18, 19], &[], &[15]),
            false,
        ),
    ]
}

/// The second half of the table.
fn more_rows() -> Vec<Row> {
    vec![
        row(
            "startup 0, grace 10, allow 10%: the two rejections are accepted, the gate passes",
            |s| {
                s.startup_s = 0;
                s.grace_s = 10;
                s.allow_503_pct = 10;
            },
            [18, 2, 0, 0],
            (&[17, 19], &[], &[]),
            true,
        ),
        row(
            "startup 0, grace 10, allow 5%: one rejection over the allowance",
            |s| {
                s.startup_s = 0;
                s.grace_s = 10;
                s.allow_503_pct = 5;
            },
            [18, 2, 0, 0],
            (&[17, 19], &[], &[]),
            false,
        ),
        row(
            "a kill fails the gate at any allowance",
            |s| {
                s.startup_s = 0;
                s.allow_503_pct = 100;
            },
            [17, 2, 0, 1],
            (&[17, 19], &[], &[15]),
            false,
        ),
        row(
            "replacement W3 at the signal, startup 0, grace 10: all 20 commit",
            |s| {
                s.startup_s = 0;
                s.grace_s = 10;
                s.replacement = true;
            },
            [20, 0, 0, 0],
            (&[], &[], &[]),
            true,
        ),
        row(
            "replacement with a 4 s startup: W3 is ready only at 34 s, #17 is still rejected",
            |s| {
                s.grace_s = 10;
                s.replacement = true;
            },
            [17, 3, 0, 0],
            (&[1, 2, 17], &[], &[]),
            false,
        ),
        row(
            "4 s invocations pass without a replacement (startup 0)",
            |s| {
                s.startup_s = 0;
                s.duration_s = 4;
            },
            [20, 0, 0, 0],
            (&[], &[], &[]),
            true,
        ),
        row(
            "4 s invocations, startup 0, grace 10",
            |s| {
                s.startup_s = 0;
                s.duration_s = 4;
                s.grace_s = 10;
            },
            [20, 0, 0, 0],
            (&[], &[], &[]),
            true,
        ),
        row(
            "grace 0 kills at the signal's own second",
            |s| {
                s.startup_s = 0;
                s.grace_s = 0;
            },
            [16, 2, 0, 2],
            (&[17, 19], &[], &[13, 15]),
            false,
        ),
    ]
}

#[test]
fn every_scenario_of_the_seed() {
    for r in seed_rows() {
        let run = run(&r.settings);
        let l = run.ledger;
        assert_eq!(
            [l.committed, l.rejected, l.failed, l.killed],
            r.ledger,
            "{}: ledger",
            r.what
        );
        assert_eq!(
            ids(&run, Status::Rejected),
            r.rejected,
            "{}: rejected",
            r.what
        );
        assert_eq!(ids(&run, Status::Failed), r.failed, "{}: failed", r.what);
        assert_eq!(ids(&run, Status::Killed), r.killed, "{}: killed", r.what);
        assert_eq!(
            run.verdict.pass, r.pass,
            "{}: verdict {:?}",
            r.what, run.verdict
        );
    }
}

#[test]
fn at_the_signal_w1_runs_13_and_15_which_end_at_32_and_36() {
    let s = Settings {
        startup_s: 0,
        ..opening()
    };
    let run = run(&s);
    let signal = run
        .events
        .iter()
        .find(|e| matches!(e, Event::Signal { .. }))
        .expect("W1 is signalled");
    assert_eq!(
        *signal,
        Event::Signal {
            at_s: 30,
            worker: 1,
            handled: true,
            running: vec![13, 15]
        }
    );
    let ends = |id: u32| {
        run.events.iter().find_map(|e| match e {
            Event::Admit {
                request, ends_at_s, ..
            } if *request == id => Some(*ends_at_s),
            _ => None,
        })
    };
    assert_eq!((ends(13), ends(15)), (Some(32), Some(36)));
    // Grace 5: SIGKILL at 35 s, one second before #15 would commit.
    let r15 = &run.requests[14];
    assert_eq!(
        (r15.status, r15.end_s, r15.worker),
        (Status::Killed, 35, Some(1))
    );
    assert!(run.events.contains(&Event::Kill {
        at_s: 35,
        worker: 1,
        running: vec![15]
    }));
}

#[test]
fn with_grace_6_the_completion_at_the_kills_second_comes_first_and_w1_exits_drained() {
    let s = Settings {
        startup_s: 0,
        grace_s: 6,
        ..opening()
    };
    let run = run(&s);
    let at36: Vec<&Event> = run.events.iter().filter(|e| e.at_s() == 36).collect();
    assert_eq!(
        at36,
        [
            &Event::Commit {
                at_s: 36,
                request: 15,
                worker: 1
            },
            &Event::Exit {
                at_s: 36,
                worker: 1,
                cause: ExitCause::Drained
            },
        ],
        "the commit, then the drained exit; no SIGKILL to a W1 already gone"
    );
}

#[test]
fn grace_0_kills_at_the_signals_own_second() {
    let s = Settings {
        startup_s: 0,
        grace_s: 0,
        ..opening()
    };
    let run = run(&s);
    let at30: Vec<&str> = run
        .events
        .iter()
        .filter(|e| e.at_s() == 30)
        .map(|e| match e {
            Event::Commit { .. } => "commit",
            Event::Signal { .. } => "signal",
            Event::Kill { .. } => "kill",
            Event::Killed { .. } => "killed",
            Event::Exit { .. } => "exit",
            _ => "other",
        })
        .collect();
    assert_eq!(
        at30,
        ["commit", "signal", "kill", "killed", "killed", "exit"]
    );
}

#[test]
fn the_replacement_boots_w3_at_the_signal_and_is_ready_after_startup() {
    let s = Settings {
        replacement: true,
        ..opening()
    };
    let run = run(&s);
    assert!(run.events.contains(&Event::Boot {
        at_s: 30,
        worker: 3,
        ready_at_s: 34
    }));
    assert!(run.events.contains(&Event::Ready {
        at_s: 34,
        worker: 3
    }));
    // #17 arrives at 33 s: W1 drains, W2 is full, W3 is not ready.
    assert_eq!(run.requests[16].status, Status::Rejected);
    // #18 at 35 s goes to W3, the least loaded.
    assert_eq!(run.requests[17].worker, Some(3));
}

#[test]
fn a_draining_w1_with_nothing_left_exits_at_the_signal() {
    let s = Settings {
        signal_at_s: 100,
        ..opening()
    };
    let run = run(&s);
    let at100: Vec<&Event> = run.events.iter().filter(|e| e.at_s() >= 100).collect();
    assert_eq!(
        at100,
        [
            &Event::Signal {
                at_s: 100,
                worker: 1,
                handled: true,
                running: vec![]
            },
            &Event::Exit {
                at_s: 100,
                worker: 1,
                cause: ExitCause::Drained
            },
        ]
    );
}

#[test]
fn ties_go_to_the_lowest_index_and_a_failure_takes_no_slot() {
    // Without route_ready, both workers at load 0: #1 and #2 go to W1 and fail.
    let s = Settings {
        route_ready: false,
        ..opening()
    };
    let run = run(&s);
    for id in [1, 2] {
        let r = &run.requests[id - 1];
        assert_eq!((r.worker, r.status), (Some(1), Status::Failed), "#{id}");
    }
    // #3 (5 s) finds both ready and empty: W1, the lowest index.
    assert_eq!(run.requests[2].worker, Some(1));
    assert_eq!(run.requests[3].worker, Some(2));
}

/// Random settings around the opening ones.
fn settings() -> impl Strategy<Value = Settings> {
    (
        (1u32..4, 1u32..4, 1u32..30, 0u64..5, 0u64..6, 1u64..15),
        (
            0u64..8,
            0u64..50,
            0u64..15,
            any::<bool>(),
            any::<bool>(),
            0u32..=100,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (workers, slots, requests, every_s, first_at_s, duration_s),
                (startup_s, signal_at_s, grace_s, handles_term, route_ready, allow, replacement),
            )| Settings {
                workers,
                slots,
                requests,
                every_s,
                first_at_s,
                duration_s,
                startup_s,
                signal_at_s,
                grace_s,
                handles_term,
                route_ready,
                allow_503_pct: allow,
                replacement,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_request_has_exactly_one_outcome(s in settings()) {
        let run = run(&s);
        prop_assert_eq!(run.requests.len(), s.requests as usize);
        let l = run.ledger;
        prop_assert_eq!(l.committed + l.rejected + l.failed + l.killed, s.requests);
        for (i, r) in run.requests.iter().enumerate() {
            prop_assert_eq!(r.id as usize, i + 1);
            // One deciding event per request: reject, fail, commit or killed.
            let decided = run.events.iter().filter(|e| match e {
                Event::Reject { request, .. }
                | Event::Fail { request, .. }
                | Event::Commit { request, .. }
                | Event::Killed { request, .. } => *request == r.id,
                _ => false,
            }).count();
            prop_assert_eq!(decided, 1, "#{} decided {} times", r.id, decided);
            match r.status {
                Status::Committed => prop_assert_eq!(r.end_s, r.arrived_s + s.duration_s),
                Status::Killed => prop_assert!(r.end_s >= r.arrived_s && r.end_s < r.arrived_s + s.duration_s),
                Status::Rejected => prop_assert_eq!((r.end_s, r.worker), (r.arrived_s, None)),
                Status::Failed => prop_assert!(!s.route_ready && r.end_s == r.arrived_s),
            }
        }
        // Events are in time order.
        prop_assert!(run.events.windows(2).all(|w| w[0].at_s() <= w[1].at_s()));
        // No worker ever runs more than its slots.
        for e in &run.events {
            if let Event::Admit { load, .. } = e {
                prop_assert!(*load <= s.slots);
            }
        }
    }

    #[test]
    fn a_larger_grace_never_kills_more(s in settings(), more in 1u64..10) {
        let longer = Settings { grace_s: s.grace_s + more, ..s.clone() };
        prop_assert!(run(&longer).ledger.killed <= run(&s).ledger.killed);
    }

    #[test]
    fn a_replacement_never_rejects_more(s in settings()) {
        let without = Settings { replacement: false, ..s.clone() };
        let with = Settings { replacement: true, ..s };
        prop_assert!(run(&with).ledger.rejected <= run(&without).ledger.rejected);
    }

    #[test]
    fn the_gate_is_the_rule(s in settings()) {
        let run = run(&s);
        let l = run.ledger;
        let rule = l.failed == 0 && l.killed == 0
            && u64::from(l.rejected) * 100 <= u64::from(s.allow_503_pct) * u64::from(s.requests);
        prop_assert_eq!(run.verdict.pass, rule);
    }
}
