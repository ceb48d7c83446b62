//! The agent's work without a kernel: a manifests directory compiled once
//! (`egressd render`, `explain --manifests`).

use crate::compile::NodeConfig;
use crate::net::HostLinks;
use crate::source::manifests::{ManifestSource, SourceError};

/// The dataplane the manifests in `dir` give on node `node` with links `host` and no
/// DNS answers (what `egressd render` prints), and what loading them reported.
pub fn compile_manifests(
    dir: &std::path::Path,
    node: &NodeConfig,
    host: &HostLinks,
) -> Result<(crate::compile::Desired, crate::source::manifests::LoadReport), SourceError> {
    let mut source = ManifestSource::new(dir);
    let report = source.load()?;
    let desired = crate::compile::compile_cached(
        source.view(),
        node,
        &crate::dns::DnsAnswers::new(),
        host,
        &mut crate::compile::CompileCache::default(),
    );
    Ok((desired, report))
}

/// What `egressd render` prints for a manifests directory and the node's links `host`:
/// the nft table that would be applied, the egress addresses, policy-routing rules and
/// routes (when there are any), each object's status, then any problems (rejected
/// documents, pod IP clashes).
pub fn render_manifests(dir: &std::path::Path, node: &NodeConfig, host: &HostLinks) -> Result<String, SourceError> {
    let (desired, report) = compile_manifests(dir, node, host)?;
    let mut out = desired.table.render();
    out.push_str(&desired.net.render());
    out.push_str("# status\n");
    out.push_str(&crate::compile::render_statuses(&desired.statuses));
    if !report.errors.is_empty() || !desired.warnings.is_empty() {
        out.push_str("# problems\n");
        for e in &report.errors {
            out.push_str(&format!("{e}\n"));
        }
        for w in &desired.warnings {
            out.push_str(&format!("{w}\n"));
        }
    }
    Ok(out)
}
