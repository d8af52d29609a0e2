//! drainit-gate: the deployment gate of docs/gate.md, outside the init binary.
//!
//! # Theory of operation
//!
//! The question a team asks before a deploy: *did every request either commit or
//! get an answer a client can safely retry?* `drainit-gate model` answers it for a
//! set of knobs (startup, grace period, surge replica, retry budget…) with a
//! deterministic drill in whole seconds: [`model::run`] is a pure function from
//! [`model::Settings`] to a [`model::Run`] (every request's outcome, the events in
//! order, the ledger and the verdict). Everything else renders that one run:
//! [`render`] the text and the JSON, [`page`] the self-contained replay page.
//! [`cli`] holds the clap definition (xtask renders the man page and completions
//! from it). The binary only wires: parse, run, print, exit 0 (pass), 1 (fail) or
//! 64 (a bad flag).
//!
//! `drainit-gate drill` ([`drill`]) runs the same scenario with real processes:
//! replicas of the user's command under the real drainit with `--proxy`, a
//! router (built in, or HAProxy), a real SIGTERM, and every request's outcome
//! joined from the client's side and the replica's exit report; it fills the same
//! page's [`page::Replay`] with measured times. `drainit-gate check` ([`check`])
//! merges the exit reports of a fleet's replicas into one verdict (exit 2 of the
//! drill: it could not run, and nothing it started is left running).
//!
//! Nothing here is linked into `drainit`: the init's size, start-up and memory do
//! not change.

pub mod check;
pub mod cli;
pub mod drill;
pub mod model;
pub mod page;
pub mod render;
