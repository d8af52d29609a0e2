//! The rollout examples stay true: every metric name and label the Argo Rollouts
//! AnalysisTemplate and the Flagger MetricTemplates query exists in a real
//! drainit's `/metrics` (drainit with `--proxy` in front of a real app, after real
//! requests), and the gated-rollout script is valid shell calling `drainit-gate
//! check` with flags it has, which passes a rollout on clean reports and rolls it
//! back on a lost request (run against a stand-in `kubectl`: no cluster here).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use support::{Replica, assert_nothing_left, gate, http_get, marker, text};

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("examples/{name}: {e}"))
}

/// A selector in a query: metric name and its `(label, op, value)` matchers.
type Selector = (String, Vec<(String, String, String)>);

/// Every `drainit_*{…}` (or bare `drainit_*`) in `text`.
fn selectors(text: &str) -> Vec<Selector> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("drainit_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_owned();
        let mut matchers = vec![];
        let after = &tail[end..];
        if let Some(body) = after.strip_prefix('{') {
            let body = &body[..body.find('}').expect("a closed selector")];
            for m in body.split(',') {
                let m = m.trim();
                let op_at = m.find(['=', '!']).expect("a matcher has an operator");
                let label = m[..op_at].trim().to_owned();
                let op_len = if m[op_at..].starts_with("=~") || m[op_at..].starts_with("!=") {
                    2
                } else {
                    1
                };
                let op = m[op_at..op_at + op_len].to_owned();
                let value = m[op_at + op_len..].trim().trim_matches('"').to_owned();
                matchers.push((label, op, value));
            }
        }
        out.push((name, matchers));
        rest = &tail[end..];
    }
    out
}

/// The `# Target labels: a, b` line: labels the scrape adds, not drainit.
fn target_labels(text: &str) -> BTreeSet<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("# Target labels:"))
        .expect("the example lists its target labels")
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect()
}

/// `/metrics` as metric name → label name → values seen.
fn scrape() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let m = marker("examples-metrics");
    let r = Replica::start(&m, &[], &[]);
    let (proxy, probe) = (r.proxy, r.probe);
    assert_eq!(http_get(proxy, "/").0, 200);
    let (code, body) = http_get(probe, "/metrics");
    r.stop();
    assert_nothing_left(&m);
    assert_eq!(code, 200, "{body}");
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, _value) = line.rsplit_once(' ').expect("name value");
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let entry = out.entry(name.to_owned()).or_default();
        for pair in labels
            .trim_end_matches('}')
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').expect("label=value");
            entry
                .entry(k.to_owned())
                .or_default()
                .insert(v.trim_matches('"').to_owned());
        }
    }
    out
}

#[test]
fn every_metric_and_label_the_rollout_examples_query_is_in_drainits_metrics() {
    let metrics = scrape();
    for file in [
        "argo-rollouts-analysis.yaml",
        "flagger-metric-template.yaml",
    ] {
        let text = example(file);
        let targets = target_labels(&text);
        // The queries: the YAML without its comments (which name metrics in prose).
        let queries: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let sels = selectors(&queries);
        assert!(sels.len() >= 2, "{file}: its queries were found");
        for (name, matchers) in sels {
            let labels = metrics
                .get(&name)
                .unwrap_or_else(|| panic!("{file}: {name} is not in drainit's /metrics"));
            for (label, op, value) in matchers {
                if targets.contains(&label) {
                    continue;
                }
                let values = labels
                    .get(&label)
                    .unwrap_or_else(|| panic!("{file}: {name} has no label {label}"));
                // An exact value, or an alternation of exact values (a|b), must be
                // values drainit writes.
                let wanted: Vec<&str> = match op.as_str() {
                    "=" | "!=" => vec![value.as_str()],
                    _ => value.split('|').collect(),
                };
                for w in wanted {
                    assert!(
                        values.contains(w),
                        "{file}: {name}{{{label}{op}\"{value}\"}}: drainit writes {label} = {values:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_gated_rollout_script_is_valid_shell_calling_the_gate_with_its_flags() {
    let path = format!(
        "{}/../examples/gated-rollout.sh",
        env!("CARGO_MANIFEST_DIR")
    );
    let st = Command::new("sh").args(["-n", &path]).status().expect("sh");
    assert!(st.success(), "sh -n {path}");
    let script = example("gated-rollout.sh");
    let call = script
        .lines()
        .find(|l| l.contains("drainit-gate check") && !l.trim_start().starts_with('#'))
        .expect("the script calls drainit-gate check");
    let help = text(&gate(&["check", "--help"], &[]).stdout);
    for flag in call.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "drainit-gate check has no {flag}");
    }
    assert!(script.contains("kubectl -n \"$ns\" logs --previous"));
}

/// A stand-in for `kubectl` (a shell script on PATH): the Deployment `web` has
/// pods web-a and web-b, whose logs (`logs -f`) end with the exit reports the test
/// wrote; web-c restarted once (its `--previous` log holds a report too). Every
/// call is appended to `calls`.
const FAKE_KUBECTL: &str = r#"#!/bin/sh
echo "$*" >>"$FAKE/calls"
case "$*" in
  *"get deployment"*) printf 'app=web,' ;;
  *"get pods"*restartCount*) printf 'web-c 1\nweb-d 0\n' ;;
  *"get pods"*) printf 'web-a\nweb-b\n' ;;
  *"logs -f "*) pod=$(echo "$*" | sed 's/.*logs -f \([^ ]*\).*/\1/'); cat "$FAKE/$pod.log" ;;
  *"logs --previous "*) pod=$(echo "$*" | sed 's/.*logs --previous \([^ ]*\).*/\1/'); cat "$FAKE/$pod.previous.log" ;;
  *) ;;
esac
"#;

fn report_line(exit: u32, completed: u32, abandoned: u32) -> String {
    format!(
        "{{\"drainit\":\"0.1.0\",\"final\":true,\"exit_code\":{exit},\"reason\":\"{}\",\"requests\":{{\"received\":{},\"rejected\":0,\"admitted\":{},\"completed\":{completed},\"unknown\":0,\"abandoned\":{abandoned},\"canceled\":0,\"in_flight\":0}}}}",
        if exit == 0 { "drained" } else { "abandoned" },
        completed + abandoned,
        completed + abandoned
    )
}

/// Runs examples/gated-rollout.sh against the stand-in; `(exit code, calls)`.
fn gated_rollout(test: &str, b_abandoned: u32) -> (Option<i32>, String, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("gated-rollout-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("dir");
    let kubectl = bin.join("kubectl");
    std::fs::write(&kubectl, FAKE_KUBECTL).expect("write");
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_drainit-gate"), bin.join("drainit-gate"))
        .expect("symlink");
    let log = |name: &str, report: String| {
        std::fs::write(dir.join(name), format!("listening on :8081\n{report}\n")).expect("write")
    };
    log("web-a.log", report_line(0, 40, 0));
    log(
        "web-b.log",
        report_line(if b_abandoned > 0 { 2 } else { 0 }, 38, b_abandoned),
    );
    log("web-c.previous.log", report_line(0, 3, 0));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!(
        "{}/../examples/gated-rollout.sh",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = Command::new("sh")
        .args([&script, "web", "registry.example/web:1.1"])
        .current_dir(&dir)
        .env("PATH", path)
        .env("FAKE", &dir)
        .output()
        .expect("sh runs");
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
    let out = format!("{}\n{}\n{calls}", text(&o.stdout), text(&o.stderr));
    (o.status.code(), out, dir)
}

#[test]
fn the_gated_rollout_passes_on_clean_reports_and_rolls_back_on_a_lost_request() {
    let (code, out, dir) = gated_rollout("clean", 0);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("set image deployment/web web=registry.example/web:1.1"),
        "{out}"
    );
    assert!(out.contains("logs --previous web-c"), "{out}");
    assert!(!out.contains("logs --previous web-d"), "{out}");
    assert!(out.contains("Ledger: 81 received, 81 completed"), "{out}");
    assert!(out.contains("the gate passes"), "{out}");
    assert!(!out.contains("rollout undo"), "{out}");
    assert!(dir.join("gate-web.html").is_file());
    let _ = std::fs::remove_dir_all(&dir);

    let (code, out, dir) = gated_rollout("lossy", 1);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("web-b.log: exit 2"), "{out}");
    assert!(out.contains("the gate FAILS; rolling back"), "{out}");
    assert!(out.contains("rollout undo deployment/web"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
