//! Criterion microbenchmarks of the pure compile step: time to compile N EgressFirewall
//! rules (spread over namespaces, with local pods), and of the table diff after one edit.
//!
//!   cargo bench --bench compile
//!
//! The workload is generated from a fixed seed-free formula, so every run compiles the
//! same view.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use egressd::api::Object;
use egressd::api::types::{
    EgressFirewall, EgressFirewallDestination, EgressFirewallPort, EgressFirewallRule, EgressFirewallSpec,
};
use egressd::compile::{CompileCache, DEFAULT_DNS_GRACE, NodeConfig, compile, compile_cached};
use egressd::dns::DnsAnswers;
use egressd::net::HostLinks;
use egressd::nft::Comparison;
use egressd::nft::delta::ElementDelta;
use egressd::view::ClusterView;
use k8s_openapi::api::core::v1::{Pod, PodIP, PodSpec, PodStatus};

/// The EgressFirewall of namespace `ns{n}`: `count` rules, all Allow but the last, every
/// third with a port; the first `moved` point at the upper half of their range.
fn firewall(n: usize, count: usize, moved: usize) -> Object {
    let egress = (0..count)
        .map(|r| EgressFirewallRule {
            rule_type: if r + 1 == count { "Deny".into() } else { "Allow".into() },
            to: EgressFirewallDestination {
                cidr_selector: Some(format!(
                    "{}.{}.{}.{}",
                    100 + r % 100,
                    (r / 100) % 256,
                    n % 256,
                    if r < moved { "128/25" } else { "0/24" }
                )),
                ..Default::default()
            },
            ports: (r % 3 == 0).then(|| vec![EgressFirewallPort { protocol: "TCP".into(), port: 443 }]),
        })
        .collect();
    let mut ef = EgressFirewall::new("default", EgressFirewallSpec { egress });
    ef.metadata.namespace = Some(format!("ns{n}"));
    Object::EgressFirewall(ef)
}

fn view(namespaces: usize, rules_per_ns: usize, pods: usize) -> ClusterView {
    let mut v = ClusterView::default();
    for n in 0..namespaces {
        v.upsert(&firewall(n, rules_per_ns, 0));
    }
    for p in 0..pods {
        let mut pod = Pod::default();
        pod.metadata.name = Some(format!("p{p}"));
        pod.metadata.namespace = Some(format!("ns{}", p % namespaces));
        pod.spec = Some(PodSpec { node_name: Some("node-a".into()), ..Default::default() });
        let ip = format!("198.18.{}.{}", p / 250, p % 250 + 1);
        pod.status =
            Some(PodStatus { phase: Some("Running".into()), pod_ips: Some(vec![PodIP { ip }]), ..Default::default() });
        v.upsert(&Object::Pod(pod));
    }
    v
}

fn node() -> NodeConfig {
    NodeConfig::new("node-a", vec!["198.18.0.0/15".parse().unwrap_or_else(|_| unreachable!())])
        .with_dns_grace(DEFAULT_DNS_GRACE)
}

fn bench_compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    for (namespaces, rules, pods) in [(10, 100, 100), (100, 100, 1000), (1000, 100, 10_000)] {
        let v = view(namespaces, rules, pods);
        let total = (namespaces * rules) as u64;
        group.throughput(Throughput::Elements(total));
        group.bench_with_input(BenchmarkId::new("rules", total), &v, |b, v| {
            b.iter(|| black_box(compile(v, &node(), &DnsAnswers::new())))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("diff_after_one_pod");
    group.sample_size(10);
    let v = view(1000, 100, 10_000);
    let before = compile(&v, &node(), &DnsAnswers::new()).table;
    let mut v2 = v.clone();
    let mut pod = Pod::default();
    pod.metadata.name = Some("new".into());
    pod.metadata.namespace = Some("ns7".into());
    pod.spec = Some(PodSpec { node_name: Some("node-a".into()), ..Default::default() });
    pod.status = Some(PodStatus { pod_ips: Some(vec![PodIP { ip: "198.19.0.1".into() }]), ..Default::default() });
    v2.upsert(&Object::Pod(pod.clone()));
    let after = compile(&v2, &node(), &DnsAnswers::new()).table;
    group.bench_function("100k_rules", |b| b.iter(|| black_box(egressd::nft::diff(&before, &after))));
    group.finish();

    // What the agent does for one pod added (or removed) at 100k rules: compile with the
    // warm cache, then find the element delta to send. Each iteration adds the pod to
    // one view or removes it again (the view moves forward, as the agent's does: the
    // pods' journal lists the one address; two views alternated would look like a jump
    // back in time and make every compile walk all pods), and keeps the previous table
    // (as the syncer does), so the pod map is patched every time.
    let mut group = c.benchmark_group("one_pod_added");
    group.sample_size(10);
    let mut cache = CompileCache::default();
    let links = HostLinks::default();
    let mut live = v.clone();
    let mut previous = compile_cached(&live, &node(), &DnsAnswers::new(), &links, &mut cache).table;
    let new_pod = Object::Pod(pod);
    let mut added = false;
    group.bench_function("100k_rules_compile_and_delta", |b| {
        b.iter(|| {
            added = !added;
            if added {
                live.upsert(&new_pod);
            } else {
                live.remove(&new_pod.key());
            }
            let after = compile_cached(&live, &node(), &DnsAnswers::new(), &links, &mut cache).table;
            let delta = ElementDelta::between(&previous, &after);
            assert_eq!(delta.as_ref().map(ElementDelta::len), Some(1), "one element added or removed");
            previous = after;
            black_box(delta)
        })
    });
    group.finish();

    // One rule edited, and one namespace's rules replaced, at 100k rules: compile with
    // the warm cache and compare the tables, alternating between the two versions.
    let mut group = c.benchmark_group("one_change");
    group.sample_size(10);
    for (name, changed) in [("rule_edited", edited(&v, 7, 1)), ("namespace_replaced", edited(&v, 8, 99))] {
        let mut cache = CompileCache::default();
        let mut previous = compile_cached(&v, &node(), &DnsAnswers::new(), &links, &mut cache).table;
        let mut flip = false;
        group.bench_function(name, |b| {
            b.iter(|| {
                flip = !flip;
                let view = if flip { &changed } else { &v };
                let after = compile_cached(view, &node(), &DnsAnswers::new(), &links, &mut cache).table;
                // What a sync decides from: the one-pass comparison of the two tables
                // (element changes, a delta or a full replace). Either edit adds or
                // removes a set (a new prefix length in its run): a delta, never a
                // full replace. (This asserted element changes only, and panicked.)
                let comparison = Comparison::of(&previous, &after);
                assert!(!comparison.is_empty() && !comparison.needs_replace(), "the change is a delta");
                let elements_only = black_box(comparison.elements_only());
                drop(comparison);
                previous = after;
                elements_only
            })
        });
    }
    group.finish();
}

/// `v` with the first `rules` rules of namespace `ns{n}` pointing elsewhere (same
/// actions and ports: the chain keeps its shape).
fn edited(v: &ClusterView, n: usize, rules: usize) -> ClusterView {
    let mut v = v.clone();
    v.upsert(&firewall(n, 100, rules));
    v
}

criterion_group!(benches, bench_compile);
criterion_main!(benches);
