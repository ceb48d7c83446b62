//! The status file in the state directory: what `egressd status` prints — a header line
//! (node, time, whether the dataplane is in sync), one line per object, then problems.
//! Written after every sync, privately and atomically ([`crate::state`]).

use std::path::Path;

use crate::compile::{Desired, NodeConfig};
pub use crate::state::STATUS_FILE;

/// The report: `statuses` is `desired`'s statuses rendered ([`crate::compile::render_statuses`]);
/// `sync_error` is why the last sync failed (`None`: it succeeded).
pub(crate) fn report(
    node: &NodeConfig,
    desired: &Desired,
    statuses: &str,
    sync_error: Option<&dyn std::fmt::Display>,
    problems: &[String],
) -> String {
    let outcome = match sync_error {
        None => "dataplane in sync".to_string(),
        Some(e) => format!("dataplane NOT in sync: {e}"),
    };
    let pid = std::process::id();
    let me = process_start(pid).map(|start| format!(" (pid {pid}, start {start})")).unwrap_or_default();
    let mut out = format!(
        "# egressd on node {} at {}{me}: {outcome}\n",
        node.node_name,
        jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now())
    );
    out.push_str(statuses);
    if !problems.is_empty() || !desired.warnings.is_empty() {
        out.push_str("# problems\n");
        for p in problems.iter().chain(&desired.warnings) {
            out.push_str(p);
            out.push('\n');
        }
    }
    out
}

/// When process `pid` started (clock ticks after boot, field 22 of `/proc/PID/stat`):
/// with the pid it names one process, even after the pid is reused.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything: count from
    // the last ')'; the state (field 3) comes first after it.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The agent that wrote `report` is not running any more: its pid, when the report
/// names one (`(pid P, start S)` in its first line) and no process with that pid and
/// start time exists now. The report then shows what that agent last applied, not the
/// kernel as it is.
pub fn writer_gone(report: &str) -> Option<u32> {
    let first = report.lines().next()?;
    let (pid, rest) = first.split_once(" (pid ")?.1.split_once(", start ")?;
    let start = rest.split_once(')')?.0;
    let (pid, start): (u32, u64) = (pid.parse().ok()?, start.parse().ok()?);
    (process_start(pid) != Some(start)).then_some(pid)
}

/// Write the report to `dir`.
pub fn write(dir: &Path, text: &str) -> std::io::Result<()> {
    // Not synced to disk: see [`crate::state`].
    crate::state::write_private_as(dir, STATUS_FILE, text.as_bytes(), false)
}

/// Read the report from `dir` (never through a symlink).
pub fn read(dir: &Path) -> std::io::Result<String> {
    let bytes = crate::state::read_private(dir, STATUS_FILE)?
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::render_statuses;

    #[test]
    fn the_report_names_the_node_the_sync_and_the_problems() {
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap()]);
        let desired = crate::compile::compile(&Default::default(), &node, &Default::default());
        let text =
            report(&node, &desired, &render_statuses(&desired.statuses), Some(&"nft said no"), &["a problem".into()]);
        assert!(text.starts_with("# egressd on node n1 at "), "{text}");
        assert!(text.contains(": dataplane NOT in sync: nft said no\n"), "{text}");
        assert!(text.ends_with("# problems\na problem\n"), "{text}");
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &text).unwrap();
        assert_eq!(read(dir.path()).unwrap(), text);
    }

    #[test]
    fn a_report_whose_writer_is_gone_is_told_apart() {
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap()]);
        let desired = crate::compile::compile(&Default::default(), &node, &Default::default());
        let text = report(&node, &desired, &render_statuses(&desired.statuses), None, &[]);
        let pid = std::process::id();
        assert!(text.contains(&format!(" (pid {pid}, start ")), "{text}");
        assert_eq!(writer_gone(&text), None, "this process wrote it and runs");
        // The same pid with another start time: a reused pid, not the writer.
        let start = process_start(pid).unwrap();
        let reused = text.replace(&format!("start {start})"), &format!("start {})", start + 1));
        assert_eq!(writer_gone(&reused), Some(pid));
        // A pid above any pid_max: gone.
        let gone = text.replace(&format!("(pid {pid},"), "(pid 4194400,");
        assert_eq!(writer_gone(&gone), Some(4_194_400));
        // A report without the pid (an older egressd): nothing can be said.
        assert_eq!(writer_gone("# egressd on node n1 at 2026-01-01T00:00:00Z: dataplane in sync\n"), None);
    }
}
