//! Where drainit runs, and what that platform waits between its stop signal and
//! SIGKILL (the grace period): the default of `--grace-period`, and the budget
//! the default pre-drain delay, phase budget and drain timeout are fitted into
//! when they were not given (docs/configuration.md; docs/drain-phases.md).
//!
//! Owns: the detection rule (markers read through [`Env`], so tests fake them),
//! each platform's grace period, and the fitting of the defaults. Must not: read
//! anything but the markers; the detection is a fact for the budget line, never a
//! reason to behave differently at the drain.

use std::time::Duration;

use super::Env;

/// The platform drainit detected (or was told with `--platform`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// `KUBERNETES_SERVICE_HOST` is set: the pod's `terminationGracePeriodSeconds`,
    /// 30 s unless told.
    Kubernetes,
    /// `/run/.containerenv` exists: `podman stop` waits 10 s.
    Podman,
    /// `/.dockerenv` exists: `docker stop` waits 10 s.
    Docker,
    /// `INVOCATION_ID` or `NOTIFY_SOCKET` is set: a systemd unit, `TimeoutStopSec`
    /// 90 s by default, which drainit extends at the drain (`EXTEND_TIMEOUT_USEC`).
    Systemd,
    /// None of these: 30 s, Kubernetes' default, as before platforms were known.
    Unknown,
}

impl Platform {
    /// The platform's default grace period.
    pub fn grace_period(self) -> Duration {
        Duration::from_secs(match self {
            Platform::Kubernetes | Platform::Unknown => 30,
            Platform::Docker | Platform::Podman => 10,
            Platform::Systemd => 90,
        })
    }

    /// Its name, as `--platform` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Kubernetes => "kubernetes",
            Platform::Podman => "podman",
            Platform::Docker => "docker",
            Platform::Systemd => "systemd",
            Platform::Unknown => "none",
        }
    }

    /// `--platform`'s value: `auto` (`None`: detect) or a platform.
    ///
    /// # Errors
    /// Any other word.
    pub fn parse(s: &str) -> Result<Option<Platform>, String> {
        Ok(Some(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => return Ok(None),
            "kubernetes" => Platform::Kubernetes,
            "podman" => Platform::Podman,
            "docker" => Platform::Docker,
            "systemd" => Platform::Systemd,
            "none" => Platform::Unknown,
            _ => {
                return Err(format!(
                    "'{s}' is not auto, kubernetes, docker, podman, systemd or none"
                ));
            }
        }))
    }

    /// Detects the platform from its markers, first match wins: Kubernetes
    /// (a pod may also carry a container runtime's marker), Podman (which some
    /// versions also mark as Docker), Docker, systemd. Returns the platform and
    /// why, for the budget line.
    pub fn detect(env: &dyn Env) -> (Platform, String) {
        let set = |k: &str| env.get(k).is_some_and(|v| !v.trim().is_empty());
        if set("KUBERNETES_SERVICE_HOST") {
            return (
                Platform::Kubernetes,
                "KUBERNETES_SERVICE_HOST is set".into(),
            );
        }
        if env.marker("/run/.containerenv") {
            return (Platform::Podman, "/run/.containerenv exists".into());
        }
        if env.marker("/.dockerenv") {
            return (Platform::Docker, "/.dockerenv exists".into());
        }
        for k in ["INVOCATION_ID", "NOTIFY_SOCKET"] {
            if set(k) {
                return (Platform::Systemd, format!("{k} is set"));
            }
        }
        (
            Platform::Unknown,
            "no platform marker (KUBERNETES_SERVICE_HOST, /run/.containerenv, /.dockerenv, \
             INVOCATION_ID, NOTIFY_SOCKET)"
                .into(),
        )
    }
}

/// Fits the durations that were not given into `room` (the grace period less
/// the spare and what was given), keeping their proportions, each rounded down to
/// 100 ms. `wanted` are the defaults of those not given; returns them unchanged
/// when they fit.
pub fn fit(wanted: &[Duration], room: Duration) -> Vec<Duration> {
    let sum: Duration = wanted.iter().sum();
    if sum <= room || sum.is_zero() {
        return wanted.to_vec();
    }
    let scale = room.as_secs_f64() / sum.as_secs_f64();
    wanted
        .iter()
        .map(|d| {
            let ms = (d.as_millis() as f64 * scale) as u64;
            Duration::from_millis(ms / 100 * 100)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn defaults_that_fit_are_kept_and_others_shrink_in_proportion() {
        assert_eq!(fit(&[s(5), s(20)], s(29)), vec![s(5), s(20)]);
        // Docker's 10 s less the 1 s spare: 9 s shared as 5 : 20.
        assert_eq!(
            fit(&[s(5), s(20)], s(9)),
            vec![Duration::from_millis(1800), Duration::from_millis(7200)]
        );
        assert_eq!(fit(&[s(5)], Duration::ZERO), vec![Duration::ZERO]);
    }

    #[test]
    fn platforms_parse_and_have_their_grace_periods() {
        assert_eq!(Platform::parse("auto"), Ok(None));
        assert_eq!(Platform::parse("Docker"), Ok(Some(Platform::Docker)));
        assert!(Platform::parse("nomad").is_err());
        assert_eq!(Platform::Docker.grace_period(), s(10));
        assert_eq!(Platform::Podman.grace_period(), s(10));
        assert_eq!(Platform::Kubernetes.grace_period(), s(30));
        assert_eq!(Platform::Systemd.grace_period(), s(90));
    }
}
