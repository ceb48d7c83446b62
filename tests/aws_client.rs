//! The EC2 client and the credential chain against moto's server on loopback (no root,
//! no namespace): every call the AWS provider makes, EC2's own errors, and each link of
//! the chain (static keys, web identity at STS, IMDSv2). Needs moto (`pip install
//! 'moto[server]'`; tests/run.sh installs it).

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egressd::aws::credentials::{CredentialChain, Source};
use egressd::aws::ec2::Ec2;

/// moto on a free loopback port, stopped (by its own PID) on drop.
struct Moto {
    child: Child,
    url: String,
}

impl Moto {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m moto.server (pip install 'moto[server]'; tests/run.sh installs it)");
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "moto did not start on {url}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, url }
    }

    /// tests/aws/ec2.py against this server.
    fn py(&self, args: &[&str]) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aws/ec2.py");
        let out = Command::new("python3").arg(script).arg(args[0]).arg(&self.url).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "ec2.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn ec2(moto: &Moto) -> Ec2 {
    let source = Source::Static { key: "test".into(), secret: "test".into(), token: None };
    Ec2::new("us-east-1", Some(&format!("{}/", moto.url)), Arc::new(CredentialChain::new(source).unwrap())).unwrap()
}

#[test]
fn every_call_of_the_provider_works_against_ec2_and_errors_carry_ec2s_code() {
    let moto = Moto::start();
    let made: serde_json::Value =
        serde_json::from_str(&moto.py(&["setup", "node-a=198.19.0.1=t2.nano", "node-b=198.19.0.2=m5.large"])).unwrap();
    let id = |n: &str| made[n]["instance"].as_str().unwrap().to_string();
    let eni = |n: &str| made[n]["interface"].as_str().unwrap().to_string();
    let client = ec2(&moto);
    rt().block_on(async {
        let mut instances = client.describe_instances(&[id("node-a"), id("node-b")]).await.unwrap();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(instances.len(), 2);
        let a = instances.iter().find(|i| i.id == id("node-a")).unwrap();
        assert_eq!(a.instance_type, "t2.nano");
        let iface = a.interface.clone().unwrap();
        assert_eq!(iface.id, eni("node-a"));
        assert_eq!(iface.primary, Some("198.19.0.1".parse().unwrap()));
        let subnets = client.describe_subnets(std::slice::from_ref(&iface.subnet)).await.unwrap();
        assert_eq!(subnets[&iface.subnet], vec!["198.19.0.0/25".parse::<ipnet::IpNet>().unwrap()]);
        let limits = client.describe_instance_types(&["t2.nano".into(), "m5.large".into()]).await.unwrap();
        assert_eq!((limits["t2.nano"], limits["m5.large"]), ((2, 2), (10, 10)));

        // Assign, move with one reassigning call, release; IPv6 too.
        let ip: IpAddr = "198.19.0.100".parse().unwrap();
        client.assign(&eni("node-a"), ip, false).await.unwrap();
        assert_eq!(moto.py(&["addresses", &eni("node-a")]), "198.19.0.1 198.19.0.100");
        client.assign(&eni("node-b"), ip, true).await.unwrap();
        assert!(moto.py(&["addresses", &eni("node-b")]).ends_with("198.19.0.100"));
        client.unassign(&eni("node-b"), ip).await.unwrap();
        assert_eq!(moto.py(&["addresses", &eni("node-b")]), "198.19.0.2");
        let v6: IpAddr = "2001:db8:0:1::100".parse().unwrap();
        client.assign(&eni("node-b"), v6, false).await.unwrap();
        let again = client.describe_instances(&[id("node-b")]).await.unwrap();
        assert!(again[0].interface.as_ref().unwrap().addresses.contains(&v6), "{again:?}");
        client.unassign(&eni("node-b"), v6).await.unwrap();
        assert_eq!(moto.py(&["addresses", &eni("node-b")]), "198.19.0.2");

        // EC2's own error, with its code and message.
        let e = client.assign("eni-0000000000000000", ip, false).await.unwrap_err();
        assert_eq!(e.code, "InvalidNetworkInterfaceID.NotFound", "{e}");
        assert!(e.message.contains("eni-0000000000000000"), "{e}");
        assert!(!e.transient());
    });
    // Nobody listening: a transport error, to be retried soon.
    drop(moto);
    let gone = Moto { child: Command::new("true").spawn().unwrap(), url: "http://127.0.0.1:9".into() };
    let e = rt().block_on(ec2(&gone).describe_instances(&["i-1".into()])).unwrap_err();
    assert_eq!(e.code, "Unreachable", "{e}");
    assert!(e.transient());
}

#[test]
fn each_link_of_the_credential_chain_fetches_from_its_service() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(
        &token,
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZWdyZXNzZDplZ3Jlc3NkIn0.c2ln\n",
    )
    .unwrap();
    rt().block_on(async {
        let web = Source::WebIdentity {
            token_file: token.to_str().unwrap().into(),
            role_arn: "arn:aws:iam::123456789012:role/egressd".into(),
            session: "egressd".into(),
            sts: format!("{}/", moto.url),
        };
        let c = CredentialChain::new(web).unwrap().get().await.unwrap();
        assert!(!c.access_key_id().is_empty() && c.session_token().is_some(), "{c:?}");
        assert!(c.expiry().is_some(), "temporary credentials expire");

        let imds = Source::Imds { endpoint: moto.url.clone() };
        let chain = CredentialChain::new(imds).unwrap();
        let c = chain.get().await.unwrap();
        assert_eq!((c.access_key_id(), c.session_token()), ("test-key", Some("test-session-token")));
        // Kept while valid: the same credentials without another fetch.
        assert_eq!(chain.get().await.unwrap().access_key_id(), "test-key");

        let missing = Source::WebIdentity {
            token_file: "/nonexistent/token".into(),
            role_arn: "arn:aws:iam::1:role/x".into(),
            session: "s".into(),
            sts: format!("{}/", moto.url),
        };
        let e = CredentialChain::new(missing).unwrap().get().await.unwrap_err();
        assert_eq!(e.code, "Credentials");
        assert!(e.message.contains("/nonexistent/token"), "{e}");
    });
}
