//! The command line: every subcommand's options as clap parses them, their checks and
//! the settings they turn into. `docs/cli.md` is generated from what this defines.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use egressd::compile::NodeConfig;
use ipnet::IpNet;

/// The exit codes, as `egressd --help` prints them.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0   normal; also on SIGTERM/SIGINT, at any point of start-up (the dataplane stays)
  1   runtime failure
  3   `egressd status`: the report was printed, but the agent that wrote it is no longer
      running (its first line says so; the report is what that agent last applied)
  64  configuration error: a missing or invalid option (every number has a range; a
      value outside it is refused naming the option), an unreadable manifests
      directory, no `nft`";

/// egressd applies Kubernetes egress policy (EgressFirewall, EgressQoS, EgressIP,
/// CloudPrivateIPConfig) to this node's kernel: one nftables table it owns, changed in
/// atomic transactions.
///
/// It follows a Kubernetes cluster, or without one reads a directory of YAML manifests
/// (`--manifests`), which is how demos, tests and static bare-metal hosts use it.
#[derive(Debug, Parser)]
#[command(name = "egressd", version, propagate_version = true, after_long_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain, env = "EGRESSD_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the policy of a Kubernetes cluster (--kubeconfig, or in-cluster) or of a
    /// manifests directory (--manifests) and follow its changes (runs until
    /// SIGTERM/SIGINT, which leave the dataplane in place).
    Run(Box<RunArgs>),
    /// Print the nft ruleset that would be applied and each object's status, touching
    /// nothing.
    Render(RenderArgs),
    /// Print the CustomResourceDefinitions egressd reads (the upstream ones, verbatim).
    Crds,
    /// Remove everything egressd owns from the kernel (its nft table, its egress
    /// addresses, policy-routing rules and routes) and nothing else.
    Cleanup(CleanupArgs),
    /// Print each object's status as the running agent last applied it (read from its
    /// state directory), with kernel errors and rejected manifests.
    Status(StatusArgs),
    /// Explain what happens to one connection from a pod: the EgressFirewall rule that
    /// decides it (or why none does), the EgressQoS rule that marks it, the EgressIP that
    /// gives it a source address and where that is hosted.
    ///
    /// By default asks the running agent (--state-dir): its view, its DNS answers and
    /// what snooping learned. With --manifests or --kubeconfig it explains from those
    /// instead (then give the node flags: --node-name, --cluster-cidr, ...).
    ///
    /// Examples:
    ///   egressd explain --pod team-a/web-0 --to 192.0.2.10:443
    ///   egressd explain --src 198.18.1.2 --to '[2001:db8::1]:53/udp' --kernel -o json
    #[command(verbatim_doc_comment)]
    Explain(Box<ExplainArgs>),
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    /// The source pod, NAMESPACE/NAME.
    #[arg(long, conflicts_with = "src", required_unless_present = "src")]
    pub(crate) pod: Option<String>,
    /// The source address (a pod's), instead of --pod.
    #[arg(long)]
    pub(crate) src: Option<std::net::IpAddr>,
    /// The destination: IP[:PORT[/tcp|udp|sctp]]; IPv6 with a port as [IP]:PORT; the
    /// protocol defaults to tcp. Without a port, rules with ports do not match.
    #[arg(long)]
    pub(crate) to: String,
    /// Explain from this manifests directory instead of asking the running agent (with
    /// --cluster-cidr, and the node's other settings where they differ from the defaults).
    #[arg(long, conflicts_with = "kubeconfig", requires = "cluster_cidrs")]
    pub(crate) manifests: Option<PathBuf>,
    /// Explain from this cluster (one list of every kind) instead of asking the running
    /// agent (with --cluster-cidr, ...).
    #[arg(long, requires = "cluster_cidrs")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The running agent's state directory (where it answers explain queries).
    #[arg(long, env = "EGRESSD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// Cross-check with this node's live table: the pod's element in the fw-pods map, its
    /// namespace number's in fw-namespaces (to the namespace's chain), and the deciding
    /// rule's counter (retry the connection: it moves); with --manifests or
    /// --kubeconfig also read the dnsName sets.
    #[arg(long)]
    pub(crate) kernel: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    /// The nft program (--kernel).
    #[arg(long, env = "EGRESSD_NFT", default_value = "nft")]
    pub(crate) nft: PathBuf,
    #[command(flatten)]
    pub(crate) node: ExplainNodeArgs,
}

/// The node settings explain reads with --manifests or --kubeconfig (as `run`'s).
#[derive(Debug, Args)]
pub(crate) struct ExplainNodeArgs {
    /// This node's name (where --kernel reads).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub(crate) node_name: String,
    /// A pod network range (never filtered); repeatable.
    #[arg(long = "cluster-cidr", env = "EGRESSD_CLUSTER_CIDRS", value_delimiter = ',')]
    pub(crate) cluster_cidrs: Vec<IpNet>,
    /// A Service range (never filtered); repeatable.
    #[arg(long = "service-cidr", env = "EGRESSD_SERVICE_CIDRS", value_delimiter = ',')]
    pub(crate) service_cidrs: Vec<IpNet>,
    /// Name of egressd's nft table.
    #[arg(long, env = "EGRESSD_TABLE", default_value = "egressd", value_parser = parse_table_name)]
    pub(crate) table: String,
    /// The agent runs without DNS snooping (wildcard dnsName rules are not enforced).
    #[arg(long, env = "EGRESSD_NO_DNS_SNOOP")]
    pub(crate) no_dns_snoop: bool,
    /// The agent runs with --egress-ip-fail-closed.
    #[arg(long, env = "EGRESSD_EGRESS_IP_FAIL_CLOSED")]
    pub(crate) egress_ip_fail_closed: bool,
}

impl ExplainNodeArgs {
    pub(crate) fn config(&self) -> NodeConfig {
        let egress = egressd::net::EgressSettings { fail_closed: self.egress_ip_fail_closed, ..Default::default() };
        NodeConfig::new(self.node_name.clone(), self.cluster_cidrs.clone())
            .with_service_cidrs(self.service_cidrs.clone())
            .with_table(self.table.clone())
            .with_egress(egress)
            .with_snoop((!self.no_dns_snoop).then(|| egressd::dns::targets::SnoopSettings {
                group: 0,
                servers: Vec::new(),
                rate: egressd::dns::targets::DEFAULT_SNOOP_RATE,
            }))
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Output {
    /// Lines for people.
    Text,
    /// One JSON object, for scripts.
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The running agent's state directory.
    #[arg(long, env = "EGRESSD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// Also print every EgressFirewall and EgressQoS rule's counter, read from the
    /// kernel now (namespace, rule index, verdict, packets, bytes).
    #[arg(long)]
    pub(crate) counters: bool,
    /// Name of egressd's nft table (--counters).
    #[arg(long, env = "EGRESSD_TABLE", default_value = "egressd", value_parser = parse_table_name)]
    pub(crate) table: String,
    /// The nft program (--counters).
    #[arg(long, env = "EGRESSD_NFT", default_value = "nft")]
    pub(crate) nft: PathBuf,
}

/// Where `run` writes its status file by default.
pub(crate) const DEFAULT_STATE_DIR: &str = "/run/egressd";

#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    /// This node's name, as in the pods' `spec.nodeName`.
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: String,
    /// A pod network range (IPv4 or IPv6); repeat for several. Destinations inside it
    /// are never filtered. Required.
    #[arg(long = "cluster-cidr", env = "EGRESSD_CLUSTER_CIDRS", value_delimiter = ',', required = true)]
    pub(crate) cluster_cidrs: Vec<IpNet>,
    /// A Service range (IPv4 or IPv6); repeat for several. Destinations inside it are
    /// never filtered.
    #[arg(long = "service-cidr", env = "EGRESSD_SERVICE_CIDRS", value_delimiter = ',')]
    pub(crate) service_cidrs: Vec<IpNet>,
    /// Name of the nft table (family inet) egressd owns.
    #[arg(long, env = "EGRESSD_TABLE", default_value = "egressd", value_parser = parse_table_name)]
    pub(crate) table: String,
    /// Seconds added to a resolved address's TTL for its kernel-side timeout: if egressd
    /// is gone that long past the TTL, the address leaves the kernel by itself.
    /// At most 604800 (7 days).
    #[arg(long, env = "EGRESSD_DNS_GRACE_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=egressd::compile::MAX_DNS_GRACE_SECS))]
    pub(crate) dns_grace_secs: u64,
    /// Longest DNS TTL honoured, for resolved and for snooped answers (seconds, 5 ..=
    /// 86400): a longer TTL is cut to this, so one answer (or one forged answer that got
    /// through) never keeps an address allowed for longer.
    #[arg(long, env = "EGRESSD_DNS_MAX_TTL_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub(crate) dns_max_ttl_secs: u64,
    #[command(flatten)]
    pub(crate) egress: EgressArgs,
    /// Conntrack mark bits holding the firewall's policy generation of a verified
    /// connection: after its first packet, an allowed connection's packets skip the
    /// rules until the policy changes (every change sends them through the rules
    /// again; the values cycle, and are cleared from conntrack before reuse: one walk
    /// of the conntrack table per 2^(bits-2) changes). Contiguous, at least two bits,
    /// clear of --egress-ip-mark-mask; 0 turns it off (every packet walks the rules,
    /// and the per-rule allow counters count every packet instead of a connection's
    /// first after each change). Default: 0x0f000000, or where that overlaps
    /// --egress-ip-mark-mask 0xf0000000, then 0x00000f00.
    #[arg(long, env = "EGRESSD_FIREWALL_VERIFIED_MARK_MASK", value_parser = parse_number)]
    pub(crate) firewall_verified_mark_mask: Option<u32>,
    /// A cluster DNS Service address the pods ask (kube-dns' ClusterIP; repeatable):
    /// answers to queries sent to it (or to a --dns-server) are snooped.
    #[arg(long = "cluster-dns", env = "EGRESSD_CLUSTER_DNS", value_delimiter = ',')]
    pub(crate) cluster_dns: Vec<std::net::IpAddr>,
    /// NFLOG group receiving the copies of pods' DNS queries and answers.
    #[arg(long, env = "EGRESSD_DNS_SNOOP_GROUP", default_value_t = 4747)]
    pub(crate) dns_snoop_group: u16,
    /// Most copies per second DNS snooping takes of pods' queries, and of the answers
    /// (each on its own; 100 ..= 1000000). Beyond it packets still pass, uncopied:
    /// counted in egressd_dns_snoop_dropped{reason="copies_over_rate_*"}.
    #[arg(long, env = "EGRESSD_DNS_SNOOP_RATE", default_value_t = egressd::dns::targets::DEFAULT_SNOOP_RATE,
          value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    pub(crate) dns_snoop_rate: u32,
    /// How pods' DNS answers reach the `dnsName` rules. `proxy`: snooped pods' queries
    /// to a trusted server (--cluster-dns, --dns-server) pass through egressd, which
    /// releases each answer once the kernel allows the addresses it teaches, so a pod's
    /// first connection after its lookup is never dropped; should egressd stop or hang,
    /// queries go to the server directly within a second and are snooped. `snoop`:
    /// answers are copied as they pass (never delayed; a pod connecting within a
    /// millisecond of its answer can lose its first SYN). `off`: neither (wildcard
    /// names cannot be enforced).
    #[arg(long, env = "EGRESSD_DNS_MODE", value_enum, default_value_t = DnsMode::Proxy)]
    pub(crate) dns_mode: DnsMode,
    /// The same as --dns-mode off (kept for existing configurations).
    #[arg(long, env = "EGRESSD_NO_DNS_SNOOP")]
    pub(crate) no_dns_snoop: bool,
    /// Port of the DNS proxy's transparent TCP listener (UDP queries are taken on the
    /// servers' own addresses and port 53; nothing listens there for anything else).
    #[arg(long, env = "EGRESSD_DNS_PROXY_PORT", default_value_t = egressd::dns::targets::DEFAULT_PROXY_PORT)]
    pub(crate) dns_proxy_port: u16,
    /// Two contiguous packet-mark bits for the DNS proxy: the lower routes a taken
    /// query to this host (a policy rule just below --egress-ip-rule-priority, to the
    /// table --egress-ip-table-base), the upper tags the proxy's own answers. Must be
    /// clear of kube-proxy's 0xc000 and of --egress-ip-mark-mask.
    #[arg(long, env = "EGRESSD_DNS_PROXY_MARK_MASK", value_parser = parse_number,
          default_value = "0x00003000")]
    pub(crate) dns_proxy_mark_mask: u32,
    /// NFLOG group receiving the copies of logged EgressFirewall verdicts (namespaces
    /// annotated k8s.ovn.org/acl-logging, EgressFirewalls in audit mode).
    #[arg(long, env = "EGRESSD_ACL_LOG_GROUP", default_value_t = egressd::compile::DEFAULT_ACL_LOG_GROUP)]
    pub(crate) acl_log_group: u16,
    /// Most new connections logged per second and rule (1 ..= 100000); beyond it they are
    /// counted in egressd_acl_log_dropped, not logged.
    #[arg(long, env = "EGRESSD_ACL_LOG_RATE", default_value_t = egressd::compile::DEFAULT_ACL_LOG_RATE,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) acl_log_rate: u32,
}

/// EgressIP dataplane settings. egressd owns exactly these marks, tables, rule priority
/// and protocol numbers, and finds its state again by them after a restart.
#[derive(Debug, Args)]
pub(crate) struct EgressArgs {
    /// Packet-mark bits egressd may use to steer selected pods' traffic to the node
    /// hosting their egress IP (other bits are left to kube-proxy, Calico, ...); each
    /// distinct set of hosting nodes uses one value under the mask.
    /// The bits must be contiguous and must not touch kube-proxy's 0x4000/0x8000.
    #[arg(long, env = "EGRESSD_EGRESS_IP_MARK_MASK", default_value = "0x00ff0000", value_parser = parse_mark_mask)]
    pub(crate) egress_ip_mark_mask: u32,
    /// egressd's routing tables are TABLE_BASE+1 ..= TABLE_BASE+255 (255 ..= 4294967039,
    /// so the range never wraps nor covers the kernel's tables 253-255).
    #[arg(long, env = "EGRESSD_EGRESS_IP_TABLE_BASE", default_value_t = 7470,
          value_parser = clap::value_parser!(u32).range(egressd::net::MIN_TABLE_BASE as i64..=egressd::net::MAX_TABLE_BASE as i64))]
    pub(crate) egress_ip_table_base: u32,
    /// Priority of egressd's `ip rule fwmark` rules, 1 ..= 32765 (before the main
    /// table's 32766).
    #[arg(long, env = "EGRESSD_EGRESS_IP_RULE_PRIORITY", default_value_t = 5470,
          value_parser = clap::value_parser!(u32).range(1..=32765))]
    pub(crate) egress_ip_rule_priority: u32,
    /// Protocol number tagging egressd's routes and (IFA_PROTO, Linux >= 6.1) its
    /// addresses, 5 ..= 255 (0-4 are the kernel's own: unspec, redirect, kernel, boot,
    /// static).
    #[arg(long, env = "EGRESSD_EGRESS_IP_PROTOCOL", default_value_t = 0xe9,
          value_parser = clap::value_parser!(u8).range(5..))]
    pub(crate) egress_ip_protocol: u8,
    /// Drop the outside traffic of pods selected by an EgressIP while no node hosts any
    /// of its IPs, instead of letting it leave with the node's own SNAT (the reference's
    /// behaviour).
    #[arg(long, env = "EGRESSD_EGRESS_IP_FAIL_CLOSED")]
    pub(crate) egress_ip_fail_closed: bool,
    /// Before hosting an egress IP, listen this long (milliseconds, 0 ..= 5000; 0: no
    /// probe) for another host answering an ARP probe (IPv4) or neighbour solicitation
    /// (IPv6) for it; if one does, the address is not taken (status, log, metric) and
    /// probed again every 2 s.
    #[arg(long, env = "EGRESSD_EGRESS_IP_DAD_MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(0..=5000))]
    pub(crate) egress_ip_dad_ms: u64,
    /// Who puts egress IPs on nodes: `direct` (the leader writes status.items),
    /// `cloud` (the leader creates a CloudPrivateIPConfig per placed IP and publishes
    /// the item once a cloud network controller assigned it), `cloud-local` (as cloud,
    /// and egressd is that controller: the named node adds the IP to its matching link;
    /// bare metal).
    #[arg(long, env = "EGRESSD_EGRESS_IP_MODE", value_enum, default_value_t = Mode::Direct)]
    pub(crate) egress_ip_mode: Mode,
    /// How a steering node's packets reach the node hosting the egress IP: `direct` (an
    /// on-link next hop, with the pod's source address: one L2 segment, nothing
    /// filtering), `vxlan` (encapsulated between the two nodes' own addresses, the
    /// egress IP's key in the VNI: routed networks, clouds), or `auto`: direct when the
    /// hosting node is on a shared link, unless a cloud fabric filters (--egress-ip-mode
    /// cloud, or a node whose spec.providerID is aws://, gce:// or azure://),
    /// vxlan otherwise. vxlan takes the mask's top bit (two mask bits at least).
    #[arg(long, env = "EGRESSD_EGRESS_IP_TRANSPORT", value_enum, default_value_t = TransportArg::Auto)]
    pub(crate) egress_ip_transport: TransportArg,
    /// UDP port of the encapsulated path; open it between nodes (node addresses to node
    /// addresses). Not 4789 (Calico, Cilium, OVN-Kubernetes' VXLAN) nor 8472 (flannel).
    #[arg(long, env = "EGRESSD_EGRESS_IP_VXLAN_PORT", default_value_t = egressd::net::DEFAULT_VXLAN_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) egress_ip_vxlan_port: u16,
}

/// `--role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// The node's dataplane, and the cluster-wide work while it holds the leader Lease.
    All,
    /// The node's dataplane only: never takes the Lease.
    Node,
    /// The cluster-wide work only (no dataplane, no nft): a Deployment.
    Controller,
}

/// `--status-zones`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ZonesArg {
    Auto,
    PerNode,
    Global,
}

impl From<ZonesArg> for egressd::status::StatusZones {
    fn from(z: ZonesArg) -> Self {
        match z {
            ZonesArg::Auto => Self::Auto,
            ZonesArg::PerNode => Self::PerNode,
            ZonesArg::Global => Self::Global,
        }
    }
}

/// `--egress-ip-transport`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum TransportArg {
    Auto,
    Direct,
    Vxlan,
}

/// `--egress-ip-mode`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Mode {
    Direct,
    Cloud,
    CloudLocal,
}

impl EgressArgs {
    pub(crate) fn settings(&self) -> egressd::net::EgressSettings {
        egressd::net::EgressSettings {
            mark_mask: self.egress_ip_mark_mask,
            table_base: self.egress_ip_table_base,
            rule_priority: self.egress_ip_rule_priority,
            route_protocol: self.egress_ip_protocol,
            address_protocol: self.egress_ip_protocol,
            fail_closed: self.egress_ip_fail_closed,
            dad_wait: Duration::from_millis(self.egress_ip_dad_ms),
            mode: match self.egress_ip_mode {
                Mode::Direct => egressd::net::EgressIpMode::Direct,
                Mode::Cloud => egressd::net::EgressIpMode::Cloud,
                Mode::CloudLocal => egressd::net::EgressIpMode::CloudLocal,
            },
            address_tags: egressd::telemetry::prereq::kernel_release()
                .is_none_or(|r| egressd::net::kernel_tags_addresses(&r)),
            transport: match self.egress_ip_transport {
                TransportArg::Auto => egressd::net::Transport::Auto,
                TransportArg::Direct => egressd::net::Transport::Direct,
                TransportArg::Vxlan => egressd::net::Transport::Vxlan,
            },
            vxlan_port: self.egress_ip_vxlan_port,
            ..Default::default()
        }
    }
}

/// `--dns-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DnsMode {
    /// Answers held until the kernel allows what they teach.
    Proxy,
    /// Answers copied as they pass.
    Snoop,
    /// Neither.
    Off,
}

pub(crate) fn parse_mark_mask(s: &str) -> Result<u32, String> {
    let mask = parse_number(s)?;
    egressd::net::EgressSettings::check_mark_mask(mask)?;
    Ok(mask)
}

pub(crate) fn parse_number(s: &str) -> Result<u32, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("{e}: a number, decimal or 0x-prefixed hex"))
}

impl NodeArgs {
    /// What the options' own parsers cannot check: the options together.
    pub(crate) fn check(&self) -> Result<(), String> {
        egressd::nft::verified::check_mask(self.verified_mark_mask(), self.egress.egress_ip_mark_mask)
            .map_err(|e| format!("--firewall-verified-mark-mask {e}"))?;
        egressd::dns::targets::DnsProxySettings::check_mark_mask(
            self.dns_proxy_mark_mask,
            &[("--egress-ip-mark-mask", self.egress.egress_ip_mark_mask)],
        )
        .map_err(|e| format!("--dns-proxy-mark-mask {e}"))
    }

    /// `--dns-mode`, with `--no-dns-snoop` meaning off.
    pub(crate) fn dns_mode(&self) -> DnsMode {
        if self.no_dns_snoop { DnsMode::Off } else { self.dns_mode }
    }

    /// `--firewall-verified-mark-mask`, or the first default clear of the EgressIP bits.
    pub(crate) fn verified_mark_mask(&self) -> u32 {
        self.firewall_verified_mark_mask.unwrap_or_else(|| {
            [egressd::compile::DEFAULT_VERIFIED_MARK_MASK, 0xf000_0000, 0x0000_0f00]
                .into_iter()
                .find(|m| m & self.egress.egress_ip_mark_mask == 0)
                .unwrap_or(0)
        })
    }

    pub(crate) fn config(&self) -> NodeConfig {
        NodeConfig::new(self.node_name.clone(), self.cluster_cidrs.clone())
            .with_service_cidrs(self.service_cidrs.clone())
            .with_table(self.table.clone())
            .with_dns_grace(Duration::from_secs(self.dns_grace_secs))
            .with_dns_max_ttl(Duration::from_secs(self.dns_max_ttl_secs))
            .with_egress(self.egress.settings())
            .with_verified_mark_mask(self.verified_mark_mask())
            .with_snoop((self.dns_mode() != DnsMode::Off).then(|| egressd::dns::targets::SnoopSettings {
                group: self.dns_snoop_group,
                servers: self.cluster_dns.clone(),
                rate: self.dns_snoop_rate,
            }))
            .with_dns_proxy((self.dns_mode() == DnsMode::Proxy).then(|| {
                egressd::dns::targets::DnsProxySettings::new(
                    self.dns_proxy_port,
                    self.dns_proxy_mark_mask,
                    &self.egress.settings(),
                )
            }))
            .with_acl_log(egressd::compile::AclLogSettings { group: self.acl_log_group, rate: self.acl_log_rate })
    }
}

pub(crate) fn parse_table_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok { Ok(s.to_string()) } else { Err("a letter followed by letters, digits, '_' or '-'".into()) }
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Directory of YAML manifests (EgressFirewall, EgressQoS, EgressIP,
    /// CloudPrivateIPConfig, Namespace, Pod, Node), watched for changes. Without it,
    /// egressd follows a Kubernetes cluster (`--kubeconfig`, or in-cluster config).
    #[arg(long, env = "EGRESSD_MANIFESTS", conflicts_with = "kubeconfig")]
    pub(crate) manifests: Option<PathBuf>,
    /// Kubeconfig file for the Kubernetes source; default: the in-cluster service
    /// account (as in the DaemonSet).
    #[arg(long, env = "EGRESSD_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// What this process does in Kubernetes mode. `all`: the node's dataplane, and the
    /// cluster-wide work (EgressIP placement, CloudPrivateIPConfigs, the statuses'
    /// aggregates, Events) while it holds the leader Lease. `node`: the dataplane and the
    /// node's own writes only, never the Lease. `controller`: the cluster-wide work only,
    /// no dataplane (run it as a Deployment under its own identity, so node credentials
    /// need not write EgressIPs: docs/security.md).
    #[arg(long, env = "EGRESSD_ROLE", value_enum, default_value_t = Role::All)]
    pub(crate) role: Role,
    /// Namespace of the leader Lease (cluster-wide work: status aggregation).
    #[arg(long, env = "POD_NAMESPACE", default_value = "egressd")]
    pub(crate) lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "egressd-leader")]
    pub(crate) lease_name: String,
    /// Seconds a leader lease stays valid without renewal (1 ..= 3600).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) lease_duration_secs: u64,
    /// Seconds between lease renewals (and attempts by the others); less than the
    /// lease duration.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) lease_renew_secs: u64,
    /// How the leader names the per-node entries of EgressFirewall and EgressQoS
    /// statuses (the reference's zones): `per-node` (`<node>: EgressFirewall Rules
    /// applied`, condition `Ready-In-Zone-<node>`, for every Ready node), `global` (one
    /// entry for the cluster, zone `global`, as the reference's centralized mode), or
    /// `auto`: per node up to 100 Ready nodes, global above (per node again at 80). Either
    /// way a node whose kernel refused an object's rules writes its own entry, and
    /// `status.status` is the aggregate. Per-node entries make every object grow with the
    /// cluster, and every agent receives them.
    #[arg(long, env = "EGRESSD_STATUS_ZONES", value_enum, default_value_t = ZonesArg::Auto)]
    pub(crate) status_zones: ZonesArg,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
    #[command(flatten)]
    pub(crate) placement: PlacementArgs,
    #[command(flatten)]
    pub(crate) webhook: WebhookArgs,
    /// The nft program.
    #[arg(long, env = "EGRESSD_NFT", default_value = "nft")]
    pub(crate) nft: PathBuf,
    /// How the nft table reaches the kernel: `netlink` sends every sync in-process, each
    /// as one nf_tables transaction (full replaces, chain, rule and set changes, element
    /// changes: pods, DNS answers, EgressIP members), for every table egressd writes
    /// (firewall, ACL logging, DNS snooping, EgressQoS, EgressIP), and reads the named
    /// counters (every 5 s) the same way; a batch the kernel refused is retried through
    /// nft, whose error is then reported. `nft` runs the nft program for all of it
    /// (slower at scale: nft parses the script and reads the whole table first). The
    /// older `--nft-elements` / EGRESSD_NFT_ELEMENTS still work. Default: netlink.
    #[arg(long, alias = "nft-elements", env = "EGRESSD_NFT_TRANSPORT", value_enum)]
    pub(crate) nft_transport: Option<NftElements>,
    /// Older name of --nft-transport's environment variable.
    #[arg(long = "nft-elements-env", hide = true, env = "EGRESSD_NFT_ELEMENTS", value_enum)]
    pub(crate) nft_elements_env: Option<NftElements>,
    /// Quiet time after a change in the directory before it is applied while a file is
    /// still being written (milliseconds, 1 ..= 60000). A file written beside under
    /// another name and renamed onto its manifest name is applied at once; files closed
    /// after writing, removed, renamed otherwise or moved in ~5 ms after their last event.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(crate) debounce_ms: u64,
    /// Re-read the directory this often even without change events (seconds, 1 ..= 86400).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) resync_secs: u64,
    /// Seconds between checks of the node's links (a change recompiles) and of
    /// egressd's addresses, rules and routes (drift is restored), 1 ..= 86400.
    #[arg(long, env = "EGRESSD_NET_CHECK_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) net_check_secs: u64,
    /// Directory for the status file `egressd status` reads.
    #[arg(long, env = "EGRESSD_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// DNS server for dnsName rules (repeatable); default: the name servers of
    /// /etc/resolv.conf (never its search domains).
    #[arg(long = "dns-server", env = "EGRESSD_DNS_SERVERS", value_delimiter = ',')]
    pub(crate) dns_servers: Vec<std::net::IpAddr>,
    /// Timeout of one DNS query (milliseconds, 1 ..= 60000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(crate) dns_timeout_ms: u64,
    /// Address of the health listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "EGRESSD_HEALTH_ADDR", default_value = "127.0.0.1:9780")]
    pub(crate) health_addr: std::net::SocketAddr,
    /// Also write logged EgressFirewall verdicts to this file (JSON lines, rotated at
    /// 10 MiB with one old file kept as FILE.1); they always go to the log.
    #[arg(long, env = "EGRESSD_ACL_LOG_FILE")]
    pub(crate) acl_log_file: Option<PathBuf>,
    /// Set the sysctls egressd needs (ip_forward, IPv6 forwarding) instead of only
    /// reporting them in /readyz and the log.
    #[arg(long, env = "EGRESSD_MANAGE_SYSCTLS")]
    pub(crate) manage_sysctls: bool,
}

/// EgressIP placement (Kubernetes mode): the leader places egress IPs on nodes labelled
/// `k8s.ovn.org/egress-assignable` and moves them off nodes that stop answering.
#[derive(Debug, Args)]
pub(crate) struct PlacementArgs {
    /// TCP port of the EgressIP health check every agent answers on all the node's
    /// addresses (it says `ok` or `fail`, nothing else) and the leader probes; 0: no
    /// probes, labelled Ready nodes count as reachable.
    #[arg(long, env = "EGRESSD_EGRESS_IP_HEALTH_PORT", default_value_t = 9107)]
    pub(crate) egress_ip_health_port: u16,
    /// How often the leader probes each egress node (milliseconds, 50 ..= 60000).
    #[arg(long, env = "EGRESSD_EGRESS_IP_PROBE_INTERVAL_MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub(crate) egress_ip_probe_interval_ms: u64,
    /// How long one probe may take (milliseconds, 50 ..= 60000).
    #[arg(long, env = "EGRESSD_EGRESS_IP_PROBE_TIMEOUT_MS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub(crate) egress_ip_probe_timeout_ms: u64,
    /// Probes missed in a row before a node's egress IPs move elsewhere (1 ..= 100).
    /// With the defaults a dead node is found within about a second.
    #[arg(long, env = "EGRESSD_EGRESS_IP_PROBE_MISSES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) egress_ip_probe_misses: u32,
    /// With --egress-ip-mode cloud: egressd is the CloudPrivateIPConfig controller for
    /// this cloud (the leader assigns each IP to the node instance's primary interface
    /// through the cloud's API and publishes each node's capacity). `aws`: EC2, the
    /// instance from spec.providerID, credentials from the standard chain (environment,
    /// web identity / IRSA, the instance role), the region from AWS_REGION or the
    /// nodes' zone; docs/aws.md. Without it, another controller (OpenShift's
    /// cloud-network-config-controller) does this.
    #[arg(long, env = "EGRESSD_CLOUD_PROVIDER", value_enum)]
    pub(crate) cloud_provider: Option<CloudProvider>,
    /// The cloud API's endpoint instead of the region's (a VPC endpoint, a test server),
    /// e.g. https://ec2.eu-west-1.amazonaws.com/.
    #[arg(long, env = "EGRESSD_CLOUD_ENDPOINT", requires = "cloud_provider")]
    pub(crate) cloud_endpoint: Option<String>,
}

/// The admission webhook of `--role controller` (docs/security.md): node agents may
/// change only their own Node's annotation, their own status entries and their own
/// node's CloudPrivateIPConfigs.
#[derive(Debug, Args)]
pub(crate) struct WebhookArgs {
    /// Serve the validating admission webhook (HTTPS, `POST /validate`) on this address;
    /// `--role controller` only. Off without it.
    #[arg(long, env = "EGRESSD_WEBHOOK_LISTEN")]
    pub(crate) webhook_listen: Option<std::net::SocketAddr>,
    /// A DNS name or IP address the webhook's certificate is for (repeat, or
    /// comma-separated): the Service's names.
    #[arg(
        long = "webhook-host",
        env = "EGRESSD_WEBHOOK_HOSTS",
        value_delimiter = ',',
        default_value = "egressd-controller.egressd.svc"
    )]
    pub(crate) webhook_hosts: Vec<String>,
    /// The Secret (in the controller's namespace, POD_NAMESPACE) that keeps the
    /// webhook's self-signed certificate; the first replica makes it for the
    /// `--webhook-host` names. Delete it (and restart the controller) to make a new one,
    /// e.g. after changing those names.
    #[arg(long, env = "EGRESSD_WEBHOOK_SECRET", default_value = "egressd-webhook")]
    pub(crate) webhook_secret: String,
    /// The ValidatingWebhookConfiguration whose caBundle the controller writes.
    #[arg(long, env = "EGRESSD_WEBHOOK_CONFIGURATION", default_value = "egressd")]
    pub(crate) webhook_configuration: String,
    /// The node agents' user name, whose writes the webhook checks (everyone else's
    /// pass).
    #[arg(long, env = "EGRESSD_WEBHOOK_NODE_USER", default_value = "system:serviceaccount:egressd:egressd")]
    pub(crate) webhook_node_user: String,
    /// Where a node agent publishes its hosting subnets (the egressd.io/egress-subnets
    /// annotation): `node`, its Node; `pod`, its own pod (`--pod-name` in
    /// POD_NAMESPACE), which the controller copies onto the Node — node credentials
    /// then need not write Nodes (the split layout).
    #[arg(long, env = "EGRESSD_SUBNETS_ON", value_enum, default_value_t = SubnetsOnArg::Node)]
    pub(crate) subnets_on: SubnetsOnArg,
    /// This agent's pod (with `--subnets-on pod`).
    #[arg(long, env = "POD_NAME", required_if_eq("subnets_on", "pod"))]
    pub(crate) pod_name: Option<String>,
    /// The label selector of the node agents' pods in the controller's namespace, whose
    /// published subnets `--role controller` copies onto their Nodes.
    #[arg(long, env = "EGRESSD_NODE_AGENT_SELECTOR", default_value = "app.kubernetes.io/name=egressd")]
    pub(crate) node_agent_selector: String,
}

/// `--subnets-on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SubnetsOnArg {
    Node,
    Pod,
}

/// `--cloud-provider`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum CloudProvider {
    Aws,
}

#[derive(Debug, Args)]
pub(crate) struct RenderArgs {
    /// Directory of YAML manifests.
    #[arg(long, env = "EGRESSD_MANIFESTS")]
    pub(crate) manifests: PathBuf,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
}

#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Name of the nft table egressd owns.
    #[arg(long, env = "EGRESSD_TABLE", default_value = "egressd", value_parser = parse_table_name)]
    pub(crate) table: String,
    /// The nft program.
    #[arg(long, env = "EGRESSD_NFT", default_value = "nft")]
    pub(crate) nft: PathBuf,
    #[command(flatten)]
    pub(crate) egress: EgressArgs,
}

/// How the nft table reaches the kernel (`run --nft-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NftElements {
    /// In-process nf_tables netlink.
    Netlink,
    /// The nft program.
    Nft,
}
