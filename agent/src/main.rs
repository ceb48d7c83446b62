//! The `egressd` binary: command line, logging and wiring. Everything else lives in the
//! `egressd` library.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use egressd::agent::{AgentError, RunConfig, render_manifests};
use egressd::compile::NodeConfig;
use egressd::dataplane::nft_cli::NftCli;
use egressd::dataplane::nft_sync::NftSyncer;
use egressd::leader::{Leadership, LeaseConfig};
use egressd::placement::controller::{PlacementSink, SubnetsOn};
use egressd::source::kube::{KubeWatch, PodScope};
use egressd::source::manifests::ManifestsWatch;
use egressd::status::writer::KubeStatusWriter;
use egressd::telemetry::Telemetry;
use tracing::{Instrument, info_span};

use cli::*;

/// Exit code for configuration errors (EX_USAGE), as linkerd2-proxy does.
const EXIT_CONFIG: u8 = 64;
/// Exit code for runtime failures.
const EXIT_FAILURE: u8 = 1;
/// `egressd status`: the report was printed, but the agent that wrote it is not running.
const EXIT_STALE: u8 = 3;

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EXIT_CONFIG) } else { ExitCode::SUCCESS };
        }
    };
    if matches!(cli.command, Command::Run(_)) {
        // Before anything else (the first log line included): a SIGTERM from here on
        // stays pending until the handlers are installed, instead of killing the agent.
        block_shutdown_signals();
    }
    init_tracing(cli.log_format);
    match cli.command {
        Command::Crds => {
            print!("{}", egressd::api::crds::all_yaml());
            ExitCode::SUCCESS
        }
        Command::Render(args) => render(&args),
        Command::Cleanup(args) => cleanup(&args),
        Command::Run(args) => run(*args),
        Command::Status(args) => status(&args),
        Command::Explain(args) => explain(&args),
    }
}

fn status(args: &StatusArgs) -> ExitCode {
    let path = args.state_dir.join(egressd::status::file::STATUS_FILE);
    let code = match egressd::status::file::read(&args.state_dir) {
        Ok(text) => match egressd::status::file::writer_gone(&text) {
            None => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Some(pid) => {
                println!(
                    "# egressd is NOT running: the agent that wrote this report (pid {pid}) has stopped; \
                     below is what it last applied, the kernel may differ now"
                );
                print!("{text}");
                ExitCode::from(EXIT_STALE)
            }
        },
        Err(e) => {
            eprintln!(
                "egressd status: cannot read {}: {e} (is `egressd run` running with --state-dir {}?)",
                path.display(),
                args.state_dir.display()
            );
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    if args.counters {
        match egressd::dataplane::rule_counters::read(&args.nft, &args.table, None) {
            Ok(counters) => print!("{}", egressd::dataplane::rule_counters::render(&args.table, &counters)),
            Err(e) => {
                eprintln!("egressd status --counters: {e}");
                return ExitCode::from(EXIT_FAILURE);
            }
        }
    }
    code
}

fn explain(args: &ExplainArgs) -> ExitCode {
    use egressd::explain::{DnsKnowledge, Query};
    let query = match Query::parse(args.pod.as_deref(), args.src, &args.to) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("egressd explain: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let local = |view: &egressd::view::ClusterView, node: &NodeConfig| {
        // Without the agent: no resolved answers; the kernel's sets with --kernel.
        let names = egressd::explain::dns_names(view, &query);
        let kernel = args
            .kernel
            .then(|| egressd::explain::kernel::dns_sets(&node.table_name, &names))
            .transpose()
            .map_err(|e| format!("cannot read the dnsName sets: {e}"))?;
        egressd::explain::explain(view, node, &DnsKnowledge { resolved: None, kernel }, &query)
            .map_err(|e| e.to_string())
    };
    let node = &args.node;
    let explained = match (&args.manifests, &args.kubeconfig) {
        (Some(dir), _) => {
            let mut source = egressd::source::manifests::ManifestSource::new(dir);
            match source.load() {
                Ok(_) => local(source.view(), &node.config()),
                Err(e) => Err(e.to_string()),
            }
        }
        (_, Some(path)) => {
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string()).and_then(
                |rt| {
                    rt.block_on(async {
                        let client = egressd::source::kube::client(Some(path)).await.map_err(|e| e.to_string())?;
                        let telemetry = std::sync::Arc::new(Telemetry::default());
                        let watch = tokio::time::timeout(
                            Duration::from_secs(30),
                            KubeWatch::start(&client, PodScope::Cluster, telemetry),
                        )
                        .await
                        .map_err(|_| "the cluster did not answer within 30 s".to_string())?;
                        local(egressd::source::ViewSource::view(&watch), &node.config())
                    })
                },
            )
        }
        (None, None) => egressd::explain::socket::ask(&args.state_dir, &query, Duration::from_secs(10)),
    };
    let mut explained = match explained {
        Ok(e) => e,
        Err(e) => {
            eprintln!("egressd explain: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    if args.kernel {
        explained.kernel = Some(egressd::explain::kernel::check(&explained, &args.nft));
    }
    match args.output {
        Output::Text => print!("{explained}"),
        Output::Json => match serde_json::to_string_pretty(&explained) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("egressd explain: {e}");
                return ExitCode::from(EXIT_FAILURE);
            }
        },
    }
    ExitCode::SUCCESS
}

/// Remove the nft table, then the egress addresses, rules and routes egressd owns.
fn cleanup(args: &CleanupArgs) -> ExitCode {
    let mut failed = false;
    let mut syncer = NftSyncer::new(NftCli::new(&args.nft));
    match syncer.delete(&args.table) {
        Ok(()) => tracing::info!(table = %args.table, "removed egressd's nft table"),
        Err(e) => {
            eprintln!("egressd cleanup: {e}");
            failed = true;
        }
    }
    let settings = args.egress.settings();
    let removed =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string()).and_then(|rt| {
            rt.block_on(async {
                let net = egressd::dataplane::netlink::Netlink::connect(settings.clone()).map_err(|e| e.to_string())?;
                let owned = net.cleanup().await.map_err(|e| e.to_string())?;
                Ok(owned + egressd::dataplane::dns_proxy::cleanup(&settings).await.map_err(|e| e.to_string())?)
            })
        });
    match removed {
        Ok(n) => tracing::info!(removed = n, "removed egressd's addresses, rules and routes"),
        Err(e) => {
            eprintln!("egressd cleanup: netlink: {e}");
            failed = true;
        }
    }
    if failed { ExitCode::from(EXIT_FAILURE) } else { ExitCode::SUCCESS }
}

fn render(args: &RenderArgs) -> ExitCode {
    // The node's links decide which egress IPs it could host: none are read here
    // (render touches nothing), so EgressIPs show as placed elsewhere or unhostable.
    if let Err(e) = args.node.check() {
        eprintln!("egressd render: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    match render_manifests(&args.manifests, &args.node.config(), &Default::default()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("egressd render: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// The `nameserver` addresses of /etc/resolv.conf (empty when unreadable).
fn resolv_conf_servers() -> Vec<std::net::IpAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse().ok())
        .collect()
}

fn run(args: RunArgs) -> ExitCode {
    // Before any thread exists: every thread shares one heap arena.
    egressd::telemetry::memory::one_arena();
    if let Err(e) = check_run_args(&args) {
        eprintln!("egressd run: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if args.role == Role::Controller {
        return run_controller(args);
    }
    let nft = NftCli::new(&args.nft);
    match nft.version() {
        Ok(v) => tracing::info!(nft = %v, "nft found"),
        Err(e) => {
            eprintln!("egressd run: {e} (install the nftables package)");
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    let nft_version = nft.version().ok();
    let telemetry = std::sync::Arc::new(Telemetry::default());
    let config = run_config(&args, telemetry.clone());
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let families = args.node.config().families();
    let verified_mask = args.node.verified_mark_mask();
    let manage = args.manage_sysctls;
    let result = runtime.block_on(async {
        let shutdown = signals_and_health(&args, &telemetry).await?;
        tokio::pin!(shutdown);
        tokio::spawn(
            prerequisites(telemetry.clone(), families, nft_version, manage).instrument(info_span!("prerequisites")),
        );
        let mut syncer = NftSyncer::new(nft.with_alias_in(&args.state_dir).with_netlink_elements(
            args.nft_transport.or(args.nft_elements_env).unwrap_or(NftElements::Netlink) == NftElements::Netlink,
        ));
        if verified_mask != 0 {
            syncer.set_generations(egressd::dataplane::verified::Generations::new(
                verified_mask,
                egressd::dataplane::verified::Conntrack,
            ));
        }
        if let Some(dir) = &args.manifests {
            let debounce = Duration::from_millis(args.debounce_ms);
            let resync = Duration::from_secs(args.resync_secs);
            let source = ManifestsWatch::open(dir, debounce, resync).await?;
            return egressd::agent::run(config, source, syncer, (), shutdown).instrument(info_span!("agent")).await;
        }
        run_kube(&args, config, syncer, telemetry, shutdown).await
    });
    exit_code(result)
}

/// `egressd run`'s runtime: two workers, threads named `egressd…` (the kernel names
/// nf_tables changes after the thread that made them, and egressd's own are told apart by
/// that name).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("egressd-worker")
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("egressd run: cannot start the runtime: {e}");
            ExitCode::from(EXIT_FAILURE)
        })
}

/// The signal handlers first (every later step — listener, first sync — can be
/// interrupted cleanly; the signals blocked in `main` are delivered from here on), then
/// the health listener. Returns what completes on SIGTERM or SIGINT.
async fn signals_and_health(
    args: &RunArgs,
    telemetry: &std::sync::Arc<Telemetry>,
) -> Result<impl std::future::Future<Output = ()> + use<>, AgentError> {
    let shutdown =
        ShutdownSignal::install().map_err(|e| AgentError::Config(format!("cannot install signal handlers: {e}")))?;
    egressd::telemetry::server::serve(args.health_addr, telemetry.clone())
        .await
        .map_err(|e| AgentError::Config(format!("--health-addr {}: {e}", args.health_addr)))?;
    Ok(shutdown.wait())
}

/// How `egressd run` ended: a configuration or Kubernetes client error is 64.
fn exit_code(result: Result<(), AgentError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (AgentError::Kube(_) | AgentError::Config(_))) => {
            eprintln!("egressd run: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("egressd run: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The checks of `egressd run`'s arguments that clap cannot make.
fn check_run_args(args: &RunArgs) -> Result<(), String> {
    args.node.check()?;
    if let Some(dir) = &args.manifests
        && !dir.is_dir()
    {
        return Err(format!("--manifests {}: not a directory", dir.display()));
    }
    if args.manifests.is_some() && args.role != Role::All {
        return Err("--role node and --role controller are for Kubernetes mode, not --manifests".into());
    }
    if args.webhook.webhook_listen.is_some() && args.role != Role::Controller {
        return Err("--webhook-listen is served by --role controller only".into());
    }
    if args.manifests.is_none() && args.kubeconfig.is_none() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        return Err("give --manifests DIR or --kubeconfig PATH (or run in a pod for the in-cluster config)".into());
    }
    if args.lease_renew_secs >= args.lease_duration_secs {
        return Err(format!(
            "--lease-renew-secs {} must be less than --lease-duration-secs {}",
            args.lease_renew_secs, args.lease_duration_secs
        ));
    }
    Ok(())
}

/// The agent's configuration from `egressd run`'s arguments.
fn run_config(args: &RunArgs, telemetry: std::sync::Arc<Telemetry>) -> RunConfig {
    let mut node = args.node.config();
    if let Some(snoop) = &mut node.snoop {
        // Trusted servers: the cluster DNS addresses, and the servers egressd itself asks.
        let own = if args.dns_servers.is_empty() { resolv_conf_servers() } else { args.dns_servers.clone() };
        for ip in own {
            if !snoop.servers.contains(&ip) {
                snoop.servers.push(ip);
            }
        }
    }
    RunConfig {
        node,
        state_dir: Some(args.state_dir.clone()),
        dns_servers: args.dns_servers.clone(),
        dns_timeout: Duration::from_millis(args.dns_timeout_ms),
        telemetry,
        net_check: Duration::from_secs(args.net_check_secs),
        acl_log_file: args.acl_log_file.clone(),
    }
}

/// `egressd run` against the API server: the leader lease, the watches, the EgressIP
/// health listener, placement and the status writer beside the agent.
async fn run_kube(
    args: &RunArgs,
    config: RunConfig,
    syncer: NftSyncer<NftCli>,
    telemetry: std::sync::Arc<Telemetry>,
    mut shutdown: impl std::future::Future<Output = ()> + Unpin,
) -> Result<(), AgentError> {
    let client = egressd::source::kube::client(args.kubeconfig.as_deref()).await?;
    let leadership = campaign(args, &client);
    let view = tokio::select! {
        v = KubeWatch::start(&client, PodScope::Node(args.node.node_name.clone()), telemetry.clone()) => v,
        _ = &mut shutdown => return Ok(()),
    };
    let p = &args.placement;
    if p.egress_ip_health_port != 0 {
        match egressd::placement::health::bind(p.egress_ip_health_port) {
            Ok(l) => {
                tokio::spawn(
                    egressd::placement::health::serve(l, telemetry.clone()).instrument(info_span!("egress_ip_health")),
                );
            }
            Err(e) => {
                return Err(AgentError::Config(format!("--egress-ip-health-port {}: {e}", p.egress_ip_health_port)));
            }
        }
    }
    let sinks = sinks(args, client, leadership, &view, placement_settings(args)?);
    egressd::agent::run(config, view, syncer, sinks, shutdown).instrument(info_span!("agent")).await
}

/// What each applied state is handed to in Kubernetes mode: the status writer and
/// placement.
fn sinks(
    args: &RunArgs,
    client: kube::Client,
    leadership: Leadership,
    view: &KubeWatch,
    settings: egressd::placement::controller::PlacementSettings,
) -> (KubeStatusWriter, PlacementSink) {
    // One copy of the nodes for both, made again only when they change.
    let nodes = egressd::status::SharedNodes::default();
    let placement = PlacementSink::start(client.clone(), settings, leadership.clone(), nodes.clone());
    let writer = KubeStatusWriter::start(
        client,
        args.node.node_name.clone(),
        leadership,
        view.status_board(),
        args.status_zones.into(),
        nodes,
    );
    (writer, placement)
}

/// The leader Lease this process campaigns for (none with `--role node`: the handle then
/// never leads).
fn campaign(args: &RunArgs, client: &kube::Client) -> Leadership {
    let leadership = Leadership::default();
    if args.role == Role::Node {
        tracing::info!("role node: the cluster-wide work is left to the controller; not campaigning for the Lease");
        return leadership;
    }
    let lease = LeaseConfig {
        namespace: args.lease_namespace.clone(),
        name: args.lease_name.clone(),
        identity: args.node.node_name.clone(),
        duration: Duration::from_secs(args.lease_duration_secs),
        renew_every: Duration::from_secs(args.lease_renew_secs),
    };
    tokio::spawn(
        egressd::leader::run(client.clone(), lease, leadership.clone()).instrument(info_span!("leader_lease")),
    );
    leadership
}

/// Placement's settings from `egressd run`'s arguments.
fn placement_settings(args: &RunArgs) -> Result<egressd::placement::controller::PlacementSettings, AgentError> {
    let p = &args.placement;
    let settings = egressd::placement::controller::PlacementSettings {
        node: args.node.node_name.clone(),
        health_port: p.egress_ip_health_port,
        probe_interval: Duration::from_millis(p.egress_ip_probe_interval_ms),
        probe_timeout: Duration::from_millis(p.egress_ip_probe_timeout_ms),
        probe_misses: p.egress_ip_probe_misses,
        cluster_cidrs: args.node.cluster_cidrs.clone(),
        mode: args.node.egress.settings().mode,
        aws: p
            .cloud_provider
            .map(|CloudProvider::Aws| egressd::aws::controller::AwsSettings { endpoint: p.cloud_endpoint.clone() }),
        subnets_on: match (args.webhook.subnets_on, &args.webhook.pod_name) {
            (SubnetsOnArg::Pod, Some(pod)) => SubnetsOn::Pod(args.lease_namespace.clone(), pod.clone()),
            _ => SubnetsOn::Node,
        },
    };
    if settings.aws.is_some() && settings.mode != egressd::net::EgressIpMode::Cloud {
        return Err(AgentError::Config("--cloud-provider needs --egress-ip-mode cloud".into()));
    }
    Ok(settings)
}

/// `egressd run --role controller`: the leader Lease, the watches (no pods: nothing the
/// cluster-wide work reads), placement and the status writer, no dataplane.
fn run_controller(args: RunArgs) -> ExitCode {
    let telemetry = std::sync::Arc::new(Telemetry::default());
    let config = run_config(&args, telemetry.clone());
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result: Result<(), AgentError> = runtime.block_on(async {
        let shutdown = signals_and_health(&args, &telemetry).await?;
        tokio::pin!(shutdown);
        let settings = placement_settings(&args)?;
        let client = egressd::source::kube::client(args.kubeconfig.as_deref()).await?;
        let leadership = campaign(&args, &client);
        // Pods are read by no cluster-wide decision: the watch is scoped to a node name
        // no pod has (this process's own).
        let scope = PodScope::Node(args.node.node_name.clone());
        let view = tokio::select! {
            v = KubeWatch::start(&client, scope, telemetry.clone()) => v,
            _ = &mut shutdown => return Ok(()),
        };
        if let Some(listen) = args.webhook.webhook_listen {
            let w = &args.webhook;
            let settings = egressd::admission::WebhookSettings {
                listen,
                hosts: w.webhook_hosts.clone(),
                namespace: args.lease_namespace.clone(),
                secret: w.webhook_secret.clone(),
                configuration: w.webhook_configuration.clone(),
                node_user: w.webhook_node_user.clone(),
            };
            egressd::admission::start(client.clone(), settings, telemetry.clone())
                .await
                .map_err(|e| AgentError::Config(e.to_string()))?;
        }
        let w = &args.webhook;
        let (namespace, selector) = (args.lease_namespace.clone(), w.node_agent_selector.clone());
        egressd::placement::relay::start(client.clone(), namespace, selector, leadership.clone());
        let sinks = sinks(&args, client, leadership, &view, settings);
        tracing::info!(identity = %args.node.node_name, "role controller: cluster-wide work only, no dataplane");
        egressd::agent::run_controller(config, view, sinks, shutdown).instrument(info_span!("controller")).await
    });
    exit_code(result)
}

/// Check the prerequisites at start and every 30 s; log what changed.
async fn prerequisites(
    telemetry: std::sync::Arc<Telemetry>,
    families: egressd::dns::Families,
    nft_version: Option<String>,
    manage: bool,
) {
    use egressd::telemetry::prereq::{Sysctls, check};
    let sysctls = Sysctls::default();
    let mut last: Vec<egressd::telemetry::prereq::Check> = Vec::new();
    loop {
        let checks = check(&sysctls, families.v4, families.v6, nft_version.as_deref(), manage);
        for c in checks.iter().filter(|c| !last.contains(c)) {
            if c.ok {
                tracing::info!(check = %c.name, detail = %c.detail, "prerequisite met");
            } else if c.required {
                tracing::warn!(check = %c.name, detail = %c.detail, "prerequisite NOT met; not ready");
            } else {
                tracing::info!(check = %c.name, detail = %c.detail, "note");
            }
        }
        telemetry.health.set_checks(checks.clone());
        last = checks;
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}

/// SIGTERM and SIGINT: blocked on the main thread first (threads started later inherit
/// the mask, child processes get a clean one from std), then handled by tokio.
fn shutdown_sigset() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGINT);
    set
}

fn block_shutdown_signals() {
    if let Err(e) = shutdown_sigset().thread_block() {
        eprintln!("egressd: cannot block SIGTERM/SIGINT during start-up: {e}");
    }
}

/// The installed SIGTERM/SIGINT handlers.
struct ShutdownSignal {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    /// Install the handlers, then let the signals through to this thread (one that
    /// arrived while blocked is delivered now and seen by [`ShutdownSignal::wait`]).
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let s = Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? };
        shutdown_sigset().thread_unblock().map_err(std::io::Error::from)?;
        Ok(s)
    }

    /// Completes on SIGTERM or SIGINT.
    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
        }
    }
}
