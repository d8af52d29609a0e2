//! drainit's own log lines on stderr: `drainit: …` in text, one JSON object per
//! line in json. A `log::Log` backend; write errors are ignored (a closed stderr
//! must never panic drainit, CONVENTIONS pitfall 9).

use std::io::Write;

use crate::config::LogFormat;

struct Logger {
    format: LogFormat,
}

impl log::Log for Logger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = match self.format {
            LogFormat::Text => match record.level() {
                log::Level::Info => format!("drainit: {}\n", record.args()),
                log::Level::Warn => format!("drainit: warning: {}\n", record.args()),
                log::Level::Error => format!("drainit: error: {}\n", record.args()),
                l => format!(
                    "drainit: {}: {}\n",
                    l.as_str().to_lowercase(),
                    record.args()
                ),
            },
            LogFormat::Json => {
                let msg = serde_json::to_string(&record.args().to_string())
                    .unwrap_or_else(|_| "\"\"".into());
                format!(
                    "{{\"drainit\":\"log\",\"level\":\"{}\",\"msg\":{msg}}}\n",
                    record.level().as_str().to_lowercase()
                )
            }
        };
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// Installs the logger (once; later calls change nothing).
pub fn init(format: LogFormat, level: log::LevelFilter) {
    let logger: &'static Logger = Box::leak(Box::new(Logger { format }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
