//! AWS credentials, the standard chain in its usual order:
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//! 2. web identity (IRSA, EKS Pod Identity's predecessor): `AWS_WEB_IDENTITY_TOKEN_FILE` and
//!    `AWS_ROLE_ARN` (`AWS_ROLE_SESSION_NAME`), exchanged at STS
//!    (`AssumeRoleWithWebIdentity`, unsigned; `AWS_ENDPOINT_URL_STS` overrides the endpoint);
//! 3. the instance's role through IMDSv2 (a session token first;
//!    `AWS_EC2_METADATA_SERVICE_ENDPOINT` overrides `http://169.254.169.254`).
//!
//! Temporary credentials are kept until five minutes before they expire.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;
use tokio::sync::Mutex;

use super::http::{Ec2Error, HttpClient, http_client, send};

/// Renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);

/// Where credentials come from, read once from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Static keys.
    Static {
        /// `AWS_ACCESS_KEY_ID`.
        key: String,
        /// `AWS_SECRET_ACCESS_KEY`.
        secret: String,
        /// `AWS_SESSION_TOKEN`.
        token: Option<String>,
    },
    /// A projected service-account token traded at STS.
    WebIdentity {
        /// `AWS_WEB_IDENTITY_TOKEN_FILE`.
        token_file: String,
        /// `AWS_ROLE_ARN`.
        role_arn: String,
        /// `AWS_ROLE_SESSION_NAME` (default `egressd`).
        session: String,
        /// The STS endpoint.
        sts: String,
    },
    /// The instance's role (IMDSv2).
    Imds {
        /// The metadata service.
        endpoint: String,
    },
}

impl Source {
    /// The chain's choice for this environment (`var` reads a variable; `region` picks
    /// the regional STS endpoint).
    pub fn from_env(var: &dyn Fn(&str) -> Option<String>, region: &str) -> Self {
        let set = |k: &str| var(k).filter(|v| !v.is_empty());
        if let (Some(key), Some(secret)) = (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
            return Self::Static { key, secret, token: set("AWS_SESSION_TOKEN") };
        }
        if let (Some(token_file), Some(role_arn)) = (set("AWS_WEB_IDENTITY_TOKEN_FILE"), set("AWS_ROLE_ARN")) {
            return Self::WebIdentity {
                token_file,
                role_arn,
                session: set("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "egressd".into()),
                sts: set("AWS_ENDPOINT_URL_STS").unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com/")),
            };
        }
        Self::Imds {
            endpoint: set("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| "http://169.254.169.254".into()),
        }
    }

    /// For logs: which link of the chain, without secrets.
    pub fn describe(&self) -> String {
        match self {
            Self::Static { .. } => "environment (AWS_ACCESS_KEY_ID)".into(),
            Self::WebIdentity { role_arn, .. } => format!("web identity ({role_arn})"),
            Self::Imds { endpoint } => format!("instance role (IMDSv2 at {endpoint})"),
        }
    }
}

/// The credentials of one [`Source`], fetched when needed and kept while valid.
pub struct CredentialChain {
    source: Source,
    http: HttpClient,
    cached: Mutex<Option<Credentials>>,
}

impl std::fmt::Debug for CredentialChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialChain").field("source", &self.source.describe()).finish()
    }
}

impl CredentialChain {
    /// A chain on its source.
    pub fn new(source: Source) -> Result<Self, Ec2Error> {
        Ok(Self { source, http: http_client()?, cached: Mutex::new(None) })
    }

    /// Credentials valid for at least a few more minutes.
    pub async fn get(&self) -> Result<Credentials, Ec2Error> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && c.expiry().is_none_or(|t| t > SystemTime::now() + RENEW_BEFORE)
        {
            return Ok(c.clone());
        }
        let fresh =
            self.fetch().await.map_err(|e| Ec2Error::new("Credentials", format!("{}: {e}", self.source.describe())))?;
        *cached = Some(fresh.clone());
        Ok(fresh)
    }

    async fn fetch(&self) -> Result<Credentials, Ec2Error> {
        match &self.source {
            Source::Static { key, secret, token } => {
                Ok(Credentials::new(key, secret, token.clone(), None, "environment"))
            }
            Source::WebIdentity { token_file, role_arn, session, sts } => {
                let token = tokio::fs::read_to_string(token_file)
                    .await
                    .map_err(|e| Ec2Error::new("Credentials", format!("{token_file}: {e}")))?;
                let body = form_urlencoded::Serializer::new(String::new())
                    .append_pair("Action", "AssumeRoleWithWebIdentity")
                    .append_pair("Version", "2011-06-15")
                    .append_pair("RoleArn", role_arn)
                    .append_pair("RoleSessionName", session)
                    .append_pair("WebIdentityToken", token.trim())
                    .finish();
                let req = request("POST", sts, &[("content-type", "application/x-www-form-urlencoded")], body)?;
                let (status, text) = send(&self.http, req).await?;
                if !(200..300).contains(&status) {
                    return Err(super::http::parse_error(status, &text));
                }
                web_identity_credentials(&text)
            }
            Source::Imds { endpoint } => {
                let base = endpoint.trim_end_matches('/');
                let req = request(
                    "PUT",
                    &format!("{base}/latest/api/token"),
                    &[("x-aws-ec2-metadata-token-ttl-seconds", "21600")],
                    String::new(),
                )?;
                let token = ok_text(send(&self.http, req).await?, "IMDS token")?;
                let auth = [("x-aws-ec2-metadata-token", token.trim())];
                let url = format!("{base}/latest/meta-data/iam/security-credentials/");
                let role = ok_text(send(&self.http, request("GET", &url, &auth, String::new())?).await?, "IMDS role")?;
                let role = role.lines().next().unwrap_or_default().trim().to_string();
                if role.is_empty() {
                    return Err(Ec2Error::new("Credentials", "the instance has no IAM role"));
                }
                let url = format!("{url}{role}");
                let text =
                    ok_text(send(&self.http, request("GET", &url, &auth, String::new())?).await?, "IMDS credentials")?;
                imds_credentials(&text)
            }
        }
    }
}

fn request(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: String,
) -> Result<http::Request<Full<Bytes>>, Ec2Error> {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).map_err(|e| Ec2Error::new("Credentials", format!("{uri}: {e}")))
}

fn ok_text((status, text): (u16, String), what: &str) -> Result<String, Ec2Error> {
    if (200..300).contains(&status) {
        Ok(text)
    } else {
        Err(Ec2Error { code: "Credentials".into(), message: format!("{what}: HTTP {status}"), status })
    }
}

fn expiry(text: &str) -> Option<SystemTime> {
    let t: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.as_second()).ok()?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ImdsCredentials {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<String>,
}

fn imds_credentials(text: &str) -> Result<Credentials, Ec2Error> {
    let c: ImdsCredentials = serde_json::from_str(text)
        .map_err(|e| Ec2Error::new("Credentials", format!("IMDS credentials unreadable: {e}")))?;
    Ok(Credentials::new(
        c.access_key_id,
        c.secret_access_key,
        c.token,
        c.expiration.as_deref().and_then(expiry),
        "imds",
    ))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AssumeRoleResponse {
    assume_role_with_web_identity_result: AssumeRoleResult,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AssumeRoleResult {
    credentials: StsCredentials,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StsCredentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

fn web_identity_credentials(text: &str) -> Result<Credentials, Ec2Error> {
    let r: AssumeRoleResponse = quick_xml::de::from_str(text)
        .map_err(|e| Ec2Error::new("Credentials", format!("STS answer unreadable: {e}")))?;
    let c = r.assume_role_with_web_identity_result.credentials;
    Ok(Credentials::new(
        c.access_key_id,
        c.secret_access_key,
        c.session_token,
        c.expiration.as_deref().and_then(expiry),
        "web-identity",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_chain_prefers_the_environment_then_web_identity_then_the_instance() {
        let all = [
            ("AWS_ACCESS_KEY_ID", "AK"),
            ("AWS_SECRET_ACCESS_KEY", "SK"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/egressd"),
        ];
        assert_eq!(
            Source::from_env(&env(&all), "eu-west-1"),
            Source::Static { key: "AK".into(), secret: "SK".into(), token: None }
        );
        assert_eq!(
            Source::from_env(&env(&all[2..]), "eu-west-1"),
            Source::WebIdentity {
                token_file: "/var/run/token".into(),
                role_arn: "arn:aws:iam::1:role/egressd".into(),
                session: "egressd".into(),
                sts: "https://sts.eu-west-1.amazonaws.com/".into(),
            }
        );
        // A key without its secret is no credential.
        assert_eq!(
            Source::from_env(&env(&all[..1]), "eu-west-1"),
            Source::Imds { endpoint: "http://169.254.169.254".into() }
        );
    }

    #[test]
    fn temporary_credentials_are_read_with_their_expiry() {
        let c = imds_credentials(r#"{"Code":"Success","AccessKeyId":"AK","SecretAccessKey":"SK","Token":"T","Expiration":"2026-11-28T06:22:20Z"}"#).unwrap();
        assert_eq!((c.access_key_id(), c.secret_access_key(), c.session_token()), ("AK", "SK", Some("T")));
        let want = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_846_940);
        assert_eq!(c.expiry(), Some(want));
        let sts = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>x</SubjectFromWebIdentityToken><Credentials><SessionToken>T2</SessionToken><SecretAccessKey>SK2</SecretAccessKey><Expiration>2026-11-28T06:22:20Z</Expiration><AccessKeyId>AK2</AccessKeyId></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"#;
        let c = web_identity_credentials(sts).unwrap();
        assert_eq!((c.access_key_id(), c.session_token(), c.expiry()), ("AK2", Some("T2"), Some(want)));
        assert!(imds_credentials("{}").is_err());
    }
}
