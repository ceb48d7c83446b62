//! A small EC2 client: the Query API (form-encoded POST, XML answers, API version
//! 2016-11-15), signed with SigV4 by `aws-sigv4` (the AWS SDK's own signing crate), over
//! the hyper client kube already brings. Only the calls the provider makes.
//! docs/aws.md has the measurements that chose this over `aws-sdk-ec2`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http_body_util::Full;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Deserialize;

use super::credentials::CredentialChain;
pub use super::http::Ec2Error;
use super::http::{HttpClient, http_client, parse_error, send};

/// The EC2 API version every call names.
const VERSION: &str = "2016-11-15";

/// An XML list: `<xSet><item>…</item>…</xSet>`.
#[derive(Debug, Deserialize)]
#[serde(bound = "T: Deserialize<'de>")]
struct Items<T> {
    #[serde(rename = "item", default = "Vec::new")]
    item: Vec<T>,
}

impl<T> Default for Items<T> {
    fn default() -> Self {
        Self { item: Vec::new() }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeInstancesResponse {
    #[serde(default)]
    reservation_set: Items<Reservation>,
    #[serde(default)]
    next_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reservation {
    #[serde(default)]
    instances_set: Items<InstanceXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstanceXml {
    instance_id: String,
    #[serde(default)]
    instance_type: String,
    #[serde(default)]
    network_interface_set: Items<InterfaceXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InterfaceXml {
    network_interface_id: String,
    #[serde(default)]
    subnet_id: String,
    #[serde(default)]
    attachment: Option<AttachmentXml>,
    #[serde(default)]
    private_ip_addresses_set: Items<PrivateIpXml>,
    #[serde(default)]
    ipv6_addresses_set: Items<Ipv6Xml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AttachmentXml {
    #[serde(default)]
    device_index: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PrivateIpXml {
    private_ip_address: String,
    #[serde(default)]
    primary: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ipv6Xml {
    ipv6_address: String,
}

/// One instance as the provider needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `i-…`.
    pub id: String,
    /// `m5.large`, ...
    pub instance_type: String,
    /// Its primary network interface (device index 0), if it has one.
    pub interface: Option<Interface>,
}

/// A network interface: its addresses now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// `eni-…`.
    pub id: String,
    /// `subnet-…`.
    pub subnet: String,
    /// The primary private IPv4 address.
    pub primary: Option<IpAddr>,
    /// Every private IPv4 and IPv6 address on it (the primary included).
    pub addresses: Vec<IpAddr>,
}

fn instances_from(r: DescribeInstancesResponse) -> Vec<Instance> {
    let mut out = Vec::new();
    for res in r.reservation_set.item {
        for i in res.instances_set.item {
            let interface = i
                .network_interface_set
                .item
                .into_iter()
                .find(|n| n.attachment.as_ref().and_then(|a| a.device_index) == Some(0))
                .map(|n| {
                    let primary = n
                        .private_ip_addresses_set
                        .item
                        .iter()
                        .find(|a| a.primary)
                        .and_then(|a| a.private_ip_address.parse().ok());
                    let mut addresses: Vec<IpAddr> = n
                        .private_ip_addresses_set
                        .item
                        .iter()
                        .filter_map(|a| a.private_ip_address.parse().ok())
                        .chain(n.ipv6_addresses_set.item.iter().filter_map(|a| a.ipv6_address.parse().ok()))
                        .collect();
                    addresses.sort();
                    addresses.dedup();
                    Interface { id: n.network_interface_id, subnet: n.subnet_id, primary, addresses }
                });
            out.push(Instance { id: i.instance_id, instance_type: i.instance_type, interface });
        }
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeSubnetsResponse {
    #[serde(default)]
    subnet_set: Items<SubnetXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubnetXml {
    subnet_id: String,
    #[serde(default)]
    cidr_block: Option<String>,
    #[serde(default)]
    ipv6_cidr_block_association_set: Items<Ipv6CidrXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ipv6CidrXml {
    ipv6_cidr_block: String,
    #[serde(default)]
    ipv6_cidr_block_state: Option<CidrStateXml>,
}

#[derive(Debug, Deserialize)]
struct CidrStateXml {
    #[serde(default)]
    state: String,
}

/// A subnet's CIDRs (IPv4 first).
fn subnets_from(r: DescribeSubnetsResponse) -> BTreeMap<String, Vec<IpNet>> {
    r.subnet_set
        .item
        .into_iter()
        .map(|s| {
            let mut nets: Vec<IpNet> =
                s.cidr_block.and_then(|c| c.parse::<Ipv4Net>().ok()).map(IpNet::V4).into_iter().collect();
            nets.extend(
                s.ipv6_cidr_block_association_set
                    .item
                    .iter()
                    .filter(|c| c.ipv6_cidr_block_state.as_ref().is_none_or(|st| st.state == "associated"))
                    .filter_map(|c| c.ipv6_cidr_block.parse::<Ipv6Net>().ok())
                    .map(IpNet::V6),
            );
            (s.subnet_id, nets)
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeInstanceTypesResponse {
    #[serde(default)]
    instance_type_set: Items<InstanceTypeXml>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstanceTypeXml {
    instance_type: String,
    network_info: NetworkInfoXml,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkInfoXml {
    #[serde(default)]
    ipv4_addresses_per_interface: u32,
    #[serde(default)]
    ipv6_addresses_per_interface: u32,
}

/// Addresses per interface of an instance type: (IPv4, IPv6).
pub type Limits = (u32, u32);

fn limits_from(r: DescribeInstanceTypesResponse) -> BTreeMap<String, Limits> {
    r.instance_type_set
        .item
        .into_iter()
        .map(|t| {
            (
                t.instance_type,
                (t.network_info.ipv4_addresses_per_interface, t.network_info.ipv6_addresses_per_interface),
            )
        })
        .collect()
}

/// The EC2 API of one region.
#[derive(Clone)]
pub struct Ec2 {
    http: HttpClient,
    endpoint: http::Uri,
    region: String,
    credentials: Arc<CredentialChain>,
}

impl std::fmt::Debug for Ec2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2").field("endpoint", &self.endpoint).field("region", &self.region).finish()
    }
}

impl Ec2 {
    /// `endpoint`: `https://ec2.<region>.amazonaws.com/` unless given.
    pub fn new(region: &str, endpoint: Option<&str>, credentials: Arc<CredentialChain>) -> Result<Self, Ec2Error> {
        let text = endpoint.map_or_else(|| format!("https://ec2.{region}.amazonaws.com/"), str::to_string);
        let endpoint: http::Uri =
            text.parse().map_err(|e| Ec2Error::local(format!("--cloud-endpoint {text:?}: {e}")))?;
        if endpoint.host().is_none() {
            return Err(Ec2Error::local(format!("--cloud-endpoint {text:?}: no host")));
        }
        Ok(Self { http: http_client()?, endpoint, region: region.to_string(), credentials })
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// One signed call: the answer's body, or EC2's error.
    async fn call(&self, action: &str, params: &[(String, String)]) -> Result<String, Ec2Error> {
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action).append_pair("Version", VERSION);
            for (k, v) in params {
                form.append_pair(k, v);
            }
            form.finish()
        };
        let creds = self.credentials.get().await?;
        let host = self.endpoint.authority().map_or("", |a| a.as_str());
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let mut req = http::Request::builder()
            .method("POST")
            .uri(self.endpoint.clone())
            .header("content-type", content_type)
            .header("host", host)
            .body(Full::new(Bytes::from(body.clone())))
            .map_err(|e| Ec2Error::local(format!("request: {e}")))?;
        self.sign(&mut req, creds, &body)?;
        let (status, text) = send(&self.http, req).await?;
        if (200..300).contains(&status) { Ok(text) } else { Err(parse_error(status, &text)) }
    }

    /// Sign `req` (SigV4, service `ec2`) in place.
    fn sign(
        &self,
        req: &mut http::Request<Full<Bytes>>,
        creds: aws_credential_types::Credentials,
        body: &str,
    ) -> Result<(), Ec2Error> {
        let identity = creds.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("ec2")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| Ec2Error::local(format!("signing: {e}")))?
            .into();
        let headers: Vec<(&str, &str)> =
            req.headers().iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))).collect();
        let uri = self.endpoint.to_string();
        let signable = SignableRequest::new("POST", &uri, headers.into_iter(), SignableBody::Bytes(body.as_bytes()))
            .map_err(|e| Ec2Error::local(format!("signing: {e}")))?;
        let (instructions, _) =
            sign(signable, &params).map_err(|e| Ec2Error::local(format!("signing: {e}")))?.into_parts();
        instructions.apply_to_request_http1x(req);
        Ok(())
    }

    /// The instances (with their primary interfaces), all pages.
    pub async fn describe_instances(&self, ids: &[String]) -> Result<Vec<Instance>, Ec2Error> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = numbered("InstanceId", ids.iter().cloned());
            if let Some(t) = &token {
                params.push(("NextToken".into(), t.clone()));
            }
            let r: DescribeInstancesResponse = parse(&self.call("DescribeInstances", &params).await?)?;
            token = r.next_token.clone().filter(|t| !t.is_empty());
            out.extend(instances_from(r));
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// The subnets' CIDRs.
    pub async fn describe_subnets(&self, ids: &[String]) -> Result<BTreeMap<String, Vec<IpNet>>, Ec2Error> {
        let params = numbered("SubnetId", ids.iter().cloned());
        Ok(subnets_from(parse(&self.call("DescribeSubnets", &params).await?)?))
    }

    /// The instance types' addresses per interface.
    pub async fn describe_instance_types(&self, types: &[String]) -> Result<BTreeMap<String, Limits>, Ec2Error> {
        let params = numbered("InstanceType", types.iter().cloned());
        Ok(limits_from(parse(&self.call("DescribeInstanceTypes", &params).await?)?))
    }

    /// Assign `ip` to the interface; IPv4 with `reassign` takes it from the interface
    /// that has it (one call: EC2 moves it).
    pub async fn assign(&self, interface: &str, ip: IpAddr, reassign: bool) -> Result<(), Ec2Error> {
        let mut params = vec![("NetworkInterfaceId".to_string(), interface.to_string())];
        let action = match ip {
            IpAddr::V4(_) => {
                params.push(("PrivateIpAddress.1".into(), ip.to_string()));
                if reassign {
                    params.push(("AllowReassignment".into(), "true".into()));
                }
                "AssignPrivateIpAddresses"
            }
            IpAddr::V6(_) => {
                params.push(("Ipv6Addresses.1".into(), ip.to_string()));
                "AssignIpv6Addresses"
            }
        };
        self.call(action, &params).await.map(drop)
    }

    /// Release `ip` from the interface.
    pub async fn unassign(&self, interface: &str, ip: IpAddr) -> Result<(), Ec2Error> {
        let (action, key) = match ip {
            IpAddr::V4(_) => ("UnassignPrivateIpAddresses", "PrivateIpAddress.1"),
            IpAddr::V6(_) => ("UnassignIpv6Addresses", "Ipv6Addresses.1"),
        };
        let params = vec![("NetworkInterfaceId".to_string(), interface.to_string()), (key.into(), ip.to_string())];
        self.call(action, &params).await.map(drop)
    }
}

/// `Name.1=a&Name.2=b…` (the Query API's lists).
fn numbered(name: &str, values: impl Iterator<Item = String>) -> Vec<(String, String)> {
    values.enumerate().map(|(i, v)| (format!("{name}.{}", i + 1), v)).collect()
}

fn parse<T: for<'de> Deserialize<'de>>(body: &str) -> Result<T, Ec2Error> {
    quick_xml::de::from_str(body).map_err(|e| Ec2Error::new("BadResponse", format!("unreadable answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Answers as moto (and EC2) send them, trimmed to what matters plus some noise.
    const INSTANCES: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><reservationSet><item><reservationId>r-1</reservationId><groupSet/><instancesSet><item><architecture>x86_64</architecture><networkInterfaceSet><item><association/><attachment><attachmentId>eni-attach-2</attachmentId><deviceIndex>1</deviceIndex></attachment><networkInterfaceId>eni-second</networkInterfaceId><privateIpAddressesSet><item><primary>true</primary><privateIpAddress>198.19.1.9</privateIpAddress></item></privateIpAddressesSet><subnetId>subnet-2</subnetId></item><item><association/><attachment><attachmentId>eni-attach-1</attachmentId><deleteOnTermination>false</deleteOnTermination><deviceIndex>0</deviceIndex><status>attached</status></attachment><groupSet><item><groupId>sg-1</groupId></item></groupSet><ipv6AddressesSet><item><ipv6Address>2001:db8::5</ipv6Address><isPrimaryIpv6>false</isPrimaryIpv6></item></ipv6AddressesSet><networkInterfaceId>eni-1</networkInterfaceId><privateIpAddress>198.19.0.1</privateIpAddress><privateIpAddressesSet><item><primary>true</primary><privateIpAddress>198.19.0.1</privateIpAddress></item><item><primary>false</primary><privateIpAddress>198.19.0.100</privateIpAddress></item></privateIpAddressesSet><subnetId>subnet-1</subnetId></item></networkInterfaceSet><instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState><instanceType>t2.nano</instanceType><placement><availabilityZone>us-east-1a</availabilityZone></placement></item></instancesSet></item></reservationSet></DescribeInstancesResponse>"#;

    #[test]
    fn instances_are_read_with_their_primary_interface_and_every_address() {
        let got = instances_from(parse(INSTANCES).unwrap());
        let ips = |s: &[&str]| s.iter().map(|a| a.parse().unwrap()).collect::<Vec<IpAddr>>();
        assert_eq!(
            got,
            vec![Instance {
                id: "i-1".into(),
                instance_type: "t2.nano".into(),
                interface: Some(Interface {
                    id: "eni-1".into(),
                    subnet: "subnet-1".into(),
                    primary: Some("198.19.0.1".parse().unwrap()),
                    addresses: ips(&["198.19.0.1", "198.19.0.100", "2001:db8::5"]),
                }),
            }]
        );
    }

    #[test]
    fn subnets_and_instance_types_are_read() {
        let subnets = r#"<DescribeSubnetsResponse><subnetSet><item><subnetId>subnet-1</subnetId><ipv6CidrBlockAssociationSet><item><ipv6CidrBlock>2001:db8:0:1::/64</ipv6CidrBlock><ipv6CidrBlockState><state>associated</state></ipv6CidrBlockState></item><item><ipv6CidrBlock>2001:db8:0:9::/64</ipv6CidrBlock><ipv6CidrBlockState><state>disassociated</state></ipv6CidrBlockState></item></ipv6CidrBlockAssociationSet><tagSet/><cidrBlock>198.19.0.0/24</cidrBlock></item><item><subnetId>subnet-2</subnetId><ipv6CidrBlockAssociationSet/><cidrBlock>198.19.1.0/24</cidrBlock></item></subnetSet></DescribeSubnetsResponse>"#;
        let got = subnets_from(parse(subnets).unwrap());
        assert_eq!(
            got["subnet-1"],
            vec!["198.19.0.0/24".parse::<IpNet>().unwrap(), "2001:db8:0:1::/64".parse().unwrap()]
        );
        assert_eq!(got["subnet-2"], vec!["198.19.1.0/24".parse::<IpNet>().unwrap()]);
        let types = r#"<DescribeInstanceTypesResponse><instanceTypeSet><item><instanceType>t2.nano</instanceType><currentGeneration>true</currentGeneration><processorInfo><supportedArchitectures><item>i386</item></supportedArchitectures></processorInfo><networkInfo><networkPerformance>Low</networkPerformance><networkCards><item><networkCardIndex>0</networkCardIndex></item></networkCards><ipv4AddressesPerInterface>2</ipv4AddressesPerInterface><ipv6AddressesPerInterface>2</ipv6AddressesPerInterface></networkInfo></item><item><instanceType>m5.large</instanceType><networkInfo><ipv4AddressesPerInterface>10</ipv4AddressesPerInterface><ipv6AddressesPerInterface>10</ipv6AddressesPerInterface></networkInfo></item></instanceTypeSet></DescribeInstanceTypesResponse>"#;
        let got = limits_from(parse(types).unwrap());
        assert_eq!(got, BTreeMap::from([("m5.large".to_string(), (10, 10)), ("t2.nano".to_string(), (2, 2))]));
    }

    #[test]
    fn errors_keep_ec2s_code_and_message_and_say_whether_to_hurry() {
        let body = r#"<?xml version="1.0" encoding="utf-8"?>
<Response><Errors><Error><Code>PrivateIpAddressLimitExceeded</Code><Message>Number of private addresses will exceed limit.</Message></Error></Errors><RequestID>r</RequestID></Response>"#;
        let e = parse_error(400, body);
        assert_eq!(e.to_string(), "PrivateIpAddressLimitExceeded: Number of private addresses will exceed limit.");
        assert!(!e.transient());
        let e = parse_error(
            503,
            "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors></Response>",
        );
        assert!(e.transient());
        let e = parse_error(502, "<html>bad gateway</html>");
        assert_eq!((e.code.as_str(), e.transient()), ("HTTP502", true));
        assert!(!parse_error(400, "<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>x</Message></Error></Errors></Response>").transient());
    }

    #[test]
    fn query_lists_are_numbered_from_one() {
        assert_eq!(
            numbered("InstanceId", ["i-1".to_string(), "i-2".to_string()].into_iter()),
            vec![("InstanceId.1".to_string(), "i-1".to_string()), ("InstanceId.2".to_string(), "i-2".to_string())]
        );
    }
}
