//! `--router haproxy`: the configuration the drill gives HAProxy (httpchk on each
//! replica's `/readyz`, `maxconn` = slots, its own 503 when all are full) and the
//! reading of its log (one line per request: the captured `X-Request-Id`, the
//! server, the status, the termination state).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

pub(super) const HAPROXY_CFG: &str = "global
    log stdout format raw local0
    maxconn 1000
defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    timeout client {client}
    timeout server {server}
    timeout queue 1ms
    timeout check {check_timeout}
frontend drill
    bind 127.0.0.1:{front}
    http-request capture req.hdr(X-Request-Id) len 40
    log-format \"drill %hr %s %ST %tsc %B\"
    default_backend replicas
backend replicas
    balance leastconn
    option httpchk GET /readyz
    default-server inter {inter} fall 1 rise 1 maxconn {slots} maxqueue 1
";

/// One line of the HAProxy log: `drill {rid} server status termination bytes`.
pub(super) fn parse_haproxy_log(text: &str) -> BTreeMap<String, (Option<String>, u16, String)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.split("drill {").nth(1) else {
            continue;
        };
        let Some((rid, rest)) = rest.split_once('}') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 3 {
            continue;
        }
        let server = (f[0] != "<NOSRV>").then(|| f[0].to_uppercase());
        out.insert(
            rid.to_string(),
            (server, f[1].parse().unwrap_or(0), f[2].to_string()),
        );
    }
    out
}

pub(super) fn haproxy_runs(path: &Path) -> bool {
    Command::new(path)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success())
}
