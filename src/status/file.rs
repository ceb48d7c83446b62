//! The status file in the state directory: what `egressd status` prints — a header line
//! (node, time, whether the dataplane is in sync), one line per object, then problems.
//! Written after every sync, privately and atomically ([`crate::state`]).

use std::path::Path;

use crate::compile::{Desired, NodeConfig, render_statuses};
pub use crate::state::STATUS_FILE;

/// The report: `sync` is how the last sync went (`Err` with the kernel's message).
pub(crate) fn report(node: &NodeConfig, desired: &Desired, sync: &Result<(), String>, problems: &[String]) -> String {
    let outcome = match sync {
        Ok(()) => "dataplane in sync".to_string(),
        Err(e) => format!("dataplane NOT in sync: {e}"),
    };
    let mut out = format!(
        "# egressd on node {} at {}: {outcome}\n",
        node.node_name,
        jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now())
    );
    out.push_str(&render_statuses(&desired.statuses));
    if !problems.is_empty() || !desired.warnings.is_empty() {
        out.push_str("# problems\n");
        for p in problems.iter().chain(&desired.warnings) {
            out.push_str(p);
            out.push('\n');
        }
    }
    out
}

/// Write the report to `dir`.
pub fn write(dir: &Path, text: &str) -> std::io::Result<()> {
    crate::state::write_private(dir, STATUS_FILE, text.as_bytes())
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

    #[test]
    fn the_report_names_the_node_the_sync_and_the_problems() {
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap()]);
        let desired = crate::compile::compile(&Default::default(), &node, &Default::default());
        let text = report(&node, &desired, &Err("nft said no".into()), &["a problem".into()]);
        assert!(text.starts_with("# egressd on node n1 at "), "{text}");
        assert!(text.contains(": dataplane NOT in sync: nft said no\n"), "{text}");
        assert!(text.ends_with("# problems\na problem\n"), "{text}");
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &text).unwrap();
        assert_eq!(read(dir.path()).unwrap(), text);
    }
}
