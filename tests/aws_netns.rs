//! `--egress-ip-mode cloud --cloud-provider aws` end to end: the three-node cluster of
//! the placement tests (`netns::cluster`) against the real test API server, and an EC2
//! API server (`moto`, from PyPI: tests/run.sh installs it) in the external host's
//! namespace, reached by the agents over the LAN. The test builds the VPC, subnet and one
//! instance per node through the EC2 API (tests/aws/ec2.py), sets each Node's
//! spec.providerID, and the agents take their credentials from the instance metadata
//! service (moto serves IMDSv2 too). Root and moto required.
//!
//! The instances' subnet is 198.19.0.0/25, narrower than the nodes' link (/24), so the
//! cloud's subnet rule is visible. node-b is a t2.nano (2 IPv4 addresses per interface: its primary and one egress IP),
//! node-a and node-c m5.large (10).

mod netns;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netns::cluster::*;
use netns::kube::*;
use netns::{Agent, tcp, wait_for};

const API_HOST: &str = "198.19.0.254";
const EC2: &str = "http://198.19.0.254:5000";
const LABEL: &str = "k8s.ovn.org/egress-assignable";
const FINALIZER: &str = "cloudprivateipconfig.cloud.network.openshift.io/finalizer";
const PODS: [&[(&str, &str)]; 3] = [&[("prod", "{app: web}")], &[("prod", "{app: web}")], &[("prod", "{app: web}")]];
const TYPES: [&str; 3] = ["m5.large", "t2.nano", "m5.large"];

fn moto_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// moto's server in `ns`, stopped (by its own PID) on drop.
struct Moto(Child);

impl Moto {
    fn start(ns: &netns::Netns, log: &Path) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-m", "moto.server", "-H", API_HOST, "-p", "5000"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let moto = Self(child);
        let up = wait_for(Duration::from_secs(20), || {
            ns.try_exec(&["curl", "-s", "-o", "/dev/null", &format!("{EC2}/moto-api/")]).0
        });
        assert!(up.is_some(), "moto did not start: {}", std::fs::read_to_string(log).unwrap_or_default());
        moto
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), sig).unwrap();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ec2_py(ns: &netns::Netns, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aws/ec2.py");
    let mut all = vec!["python3", script.to_str().unwrap()];
    all.extend_from_slice(args);
    ns.exec(&all).trim().to_string()
}

fn label(api: &ApiServer, node: &str, on: bool) {
    let arg = if on { format!("{LABEL}=") } else { format!("{LABEL}-") };
    let (ok, out) = api.kubectl(&["label", "node", node, &arg, "--overwrite"], "");
    assert!(ok, "{out}");
}

fn logs(agents: &[Option<Agent>]) -> String {
    agents.iter().flatten().map(|a| format!("--- {}\n{}", a.log.display(), a.log_text())).collect()
}

#[test]
fn aws_assigns_moves_caps_survives_an_ec2_outage_and_releases() {
    netns::require_root();
    assert!(moto_installed(), "moto is not installed: pip install 'moto[server]' (tests/run.sh installs it)");
    let c = Cluster::new(&PODS);
    let dir = c.dir.path().join("kube");
    let api = ApiServer::start(&c.ext, dir.clone(), API_HOST);
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    declare_egress_cluster(
        &api,
        &names,
        &[1, 1, 1],
        |n| n > 0,
        |n| vec![node_v4(n), node_v6(n)],
        |n, i| [pod_v4(n, i), pod_v6(n, i)],
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("daemonset/modes");
    for f in ["cloud/rbac.yaml", "aws/rbac.yaml"] {
        api.apply(&std::fs::read_to_string(root.join(f)).unwrap());
    }
    let moto = Moto::start(&c.ext, &c.dir.path().join("moto.log"));
    let specs: Vec<String> = (0..3).map(|n| format!("{}={}={}", names[n], node_v4(n), TYPES[n])).collect();
    let mut args = vec!["setup", EC2];
    args.extend(specs.iter().map(String::as_str));
    let inventory: serde_json::Value = serde_json::from_str(&ec2_py(&c.ext, &args)).unwrap();
    let eni = |n: &str| inventory[n]["interface"].as_str().unwrap().to_string();
    let on_eni = |n: &str| ec2_py(&c.ext, &["addresses", EC2, &eni(n)]);
    for n in &names {
        let id = format!("aws:///us-east-1a/{}", inventory[*n]["instance"].as_str().unwrap());
        let (ok, out) = api.kubectl(
            &["patch", "node", n, "--type=merge", "-p", &format!(r#"{{"spec":{{"providerID":"{id}"}}}}"#)],
            "",
        );
        assert!(ok, "{out}");
    }

    let extra = ["--egress-ip-mode", "cloud", "--cloud-provider", "aws", "--cloud-endpoint", EC2];
    // Credentials from the instance metadata service (IMDSv2), the region from the zone.
    let env = [("AWS_EC2_METADATA_SERVICE_ENDPOINT", EC2)];
    let start = |n: usize| {
        let node = &c.nodes[n];
        let health = format!("127.0.0.1:{}", 9780 + n);
        start_kube_agent_env(
            &node.ns,
            &api,
            c.dir.path(),
            &node.name,
            &health,
            &["198.18.0.0/16", "2001:db8:1::/48"],
            &extra,
            &env,
        )
    };
    let holder = || api.get(&["lease", "egressd-leader", "-n", "egressd", "-o", "jsonpath={.spec.holderIdentity}"]);
    let mut agents = vec![Some(start(0))];
    assert!(wait_for(Duration::from_secs(10), || holder() == "node-a").is_some(), "node-a never led");
    agents.push(Some(start(1)));
    agents.push(Some(start(2)));
    let dump = |what: &str, agents: &[Option<Agent>]| {
        format!(
            "{what}\n{}\n{}\n{}\n{}",
            api.get(&["cloudprivateipconfig", "-o", "yaml"]),
            api.get(&["egressip", "-o", "yaml"]),
            api.get(&["events", "-n", "default"]),
            logs(agents)
        )
    };

    // An EgressIP with one IP no node may host: NoMatchingNodeFound, no config, no item;
    // then deleted.
    let placed_nowhere = |name: &str, ip: &str, why: &str| {
        egress_ip(&api, name, &[ip]);
        let message = format!(
            "No matching nodes found, which can host any of the egress IPs: [{ip}] for object EgressIP: {name}"
        );
        let event = wait_for(Duration::from_secs(15), || api.get(&["events", "-n", "default"]).contains(&message));
        assert!(event.is_some(), "{}", dump(&format!("{why}: no NoMatchingNodeFound"), &agents));
        assert!(config(&api, ip).is_empty() && items(&api, name).is_empty(), "{why}");
        let (ok, out) = api.kubectl(&["delete", "egressip", name], "");
        assert!(ok, "{out}");
    };

    // Capacity: every node's annotation, in the reference's shape.
    let annotation = |n: &str| {
        api.get(&["node", n, "-o", r#"jsonpath={.metadata.annotations.cloud\.network\.openshift\.io/egress-ipconfig}"#])
    };
    let want_b = format!(
        r#"[{{"capacity":{{"ipv4":1,"ipv6":2}},"ifaddr":{{"ipv4":"198.19.0.0/25"}},"interface":"{}"}}]"#,
        eni("node-b")
    );
    assert!(
        wait_for(Duration::from_secs(15), || annotation("node-b") == want_b).is_some(),
        "{}",
        dump(&format!("annotation {}", annotation("node-b")), &agents)
    );
    assert!(annotation("node-c").contains(r#""capacity":{"ipv4":9,"ipv6":10}"#), "{}", annotation("node-c"));

    // Placed on node-b (least loaded by name): EC2 assigns it to b's interface, the
    // config says so, the item follows, node-b hosts it and pods leave with it.
    egress_ip(&api, "e1", &[EIP_B]);
    let assigned =
        |n: &str| format!("{n}|{n}|True|CloudResponseSuccess|IP address successfully added|[\"{FINALIZER}\"]");
    assert!(
        wait_for(Duration::from_secs(20), || config(&api, EIP_B) == assigned("node-b")).is_some(),
        "{}",
        dump("not assigned", &agents)
    );
    assert_eq!(on_eni("node-b"), format!("{} {EIP_B}", node_v4(1)));
    assert!(
        wait_for(Duration::from_secs(10), || items(&api, "e1") == vec![(EIP_B.to_string(), "node-b".to_string())])
            .is_some()
    );
    assert!(wait_for(Duration::from_secs(10), || c.has_addr(1, EIP_B)).is_some(), "node-b does not host it");
    let a_pod = &c.nodes[0].pods[0];
    assert!(
        wait_for(Duration::from_secs(10), || tcp(a_pod, EXT_V4, 8080).as_deref() == Some(EIP_B)).is_some(),
        "{}",
        dump("traffic does not leave with the egress IP", &agents)
    );
    // b's one slot is taken: its capacity stays 1 (egress IPs count against it in placement).
    assert!(wait_for(Duration::from_secs(5), || annotation("node-b") == want_b).is_some(), "{}", annotation("node-b"));

    // The cloud's rule: an IP outside the instances' subnet (198.19.0.0/25), though on
    // the nodes' link (198.19.0.0/24), is placed nowhere: an Event, no config.
    placed_nowhere("e4", "198.19.0.200", "an IP outside the subnet");

    // Capacity exhausted: only node-b assignable, and it is full: nothing placed, no
    // config, NoMatchingNodeFound.
    label(&api, "node-c", false);
    placed_nowhere("e2", "198.19.0.101", "capacity exhausted");

    // Move: node-b loses its label, node-c gets it back: one reassigning call puts the
    // address on c's interface (EC2 takes it from b's).
    label(&api, "node-c", true);
    label(&api, "node-b", false);
    assert!(
        wait_for(Duration::from_secs(20), || config(&api, EIP_B) == assigned("node-c")).is_some(),
        "{}",
        dump("not moved", &agents)
    );
    assert!(
        wait_for(Duration::from_secs(10), || on_eni("node-c") == format!("{} {EIP_B}", node_v4(2))).is_some(),
        "{}",
        on_eni("node-c")
    );
    assert!(
        wait_for(Duration::from_secs(10), || on_eni("node-b") == node_v4(1)).is_some(),
        "still on b: {}",
        on_eni("node-b")
    );
    let leader_log = agents[0].as_ref().unwrap().log_text();
    let calls: Vec<&str> = leader_log.lines().filter(|l| l.contains("EC2 call done") && l.contains(EIP_B)).collect();
    assert!(
        calls.iter().any(|l| l.contains("Assign {") && l.contains("node: \"node-c\"") && l.contains("reassign: true")),
        "the move is not one reassignment: {calls:#?}"
    );
    assert!(wait_for(Duration::from_secs(10), || c.has_addr(2, EIP_B) && !c.has_addr(1, EIP_B)).is_some());
    assert!(wait_for(Duration::from_secs(10), || tcp(a_pod, EXT_V4, 8080).as_deref() == Some(EIP_B)).is_some());

    // EC2 unreachable for 30 s (moto stopped), and the leader dies meanwhile: a new
    // request waits (no status), then the new leader converges.
    label(&api, "node-b", true);
    moto.signal(nix::sys::signal::Signal::SIGSTOP);
    egress_ip(&api, "e3", &["198.19.0.102"]);
    let requested = wait_for(Duration::from_secs(15), || config(&api, "198.19.0.102").starts_with("node-b||||"));
    assert!(requested.is_some(), "{}", dump("no config for e3", &agents));
    if let Some(mut a) = agents[0].take() {
        a.kill();
        agents[0] = Some(a);
    }
    std::thread::sleep(Duration::from_secs(30));
    assert_eq!(config(&api, "198.19.0.102"), "node-b|||||", "nothing is reported while EC2 is away");
    assert!(items(&api, "e3").is_empty());
    moto.signal(nix::sys::signal::Signal::SIGCONT);
    assert!(
        wait_for(Duration::from_secs(30), || config(&api, "198.19.0.102") == assigned("node-b")).is_some(),
        "{}",
        dump("did not converge after the outage", &agents)
    );
    assert_eq!(on_eni("node-b"), format!("{} 198.19.0.102", node_v4(1)));
    assert!(wait_for(Duration::from_secs(10), || c.has_addr(1, "198.19.0.102")).is_some());
    assert_eq!(config(&api, EIP_B), assigned("node-c"), "what was assigned stays");

    // Delete: released in EC2, then the finalizer goes and the config with it.
    let (ok, out) = api.kubectl(&["delete", "egressip", "e1"], "");
    assert!(ok, "{out}");
    assert!(
        wait_for(Duration::from_secs(20), || config(&api, EIP_B).is_empty()).is_some(),
        "{}",
        dump("not deleted", &agents)
    );
    assert_eq!(on_eni("node-c"), node_v4(2), "released in EC2");
    assert!(wait_for(Duration::from_secs(10), || !c.has_addr(2, EIP_B)).is_some());
}
