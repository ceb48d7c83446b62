//! Where objects come from. Every source fills the same [`crate::view::ClusterView`]; the
//! compile step does not know which one it was.
//!
//! * [`manifests`]: a directory of YAML files (the embedded default: demos, tests,
//!   static hosts), watched for changes.

pub mod kube;
pub mod manifests;

use crate::view::ClusterView;

/// Where the view comes from, for the agent loop.
#[allow(async_fn_in_trait)]
pub trait ViewSource {
    /// The current view.
    fn view(&self) -> &ClusterView;
    /// The current view, to give invalid objects their saved last good versions after a
    /// restart ([`ClusterView::adopt_last_good`]).
    fn view_mut(&mut self) -> &mut ClusterView;
    /// Problems to report in the status file (rejected documents, watch errors).
    fn problems(&self) -> Vec<String>;
    /// Wait for the next change. `Ok(true)`: the view (may have) changed and must be
    /// recompiled; `Ok(false)`: nothing to do.
    async fn next_change(&mut self) -> bool;
    /// When the change the last [`ViewSource::next_change`] reported was first seen (the
    /// watch event arriving, before it was read or coalesced), for the time from a
    /// change to the kernel having it; `None` when the source does not tell.
    fn seen_at(&self) -> Option<std::time::Instant> {
        None
    }
}
