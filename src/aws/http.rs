//! The HTTP side of every AWS call (EC2, STS, IMDS): the client, one request with its
//! bound, and the error every call reports ([`Ec2Error`]: EC2's own code and message,
//! or what failed before or after it answered).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Deserialize;

/// One call's bound (connect, send, answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client (https or http: `--cloud-endpoint` may name a plain-http test server).
pub(crate) type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// A client with the system's root certificates, http/1.1.
pub(crate) fn http_client() -> Result<HttpClient, Ec2Error> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| Ec2Error::local(format!("no root certificates: {e}")))?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https))
}

/// An EC2 error: EC2's own code and message, or a transport failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Ec2Error {
    /// EC2's error code (`InvalidParameterValue`, `PrivateIpAddressLimitExceeded`, ...),
    /// or `Unreachable`, `Timeout`, `Credentials`, `BadResponse`, `Config` for what
    /// happened before or after EC2 answered.
    pub code: String,
    /// EC2's message, or the transport's.
    pub message: String,
    /// The HTTP status (0: none).
    pub status: u16,
}

impl Ec2Error {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_string(), message: message.into(), status: 0 }
    }

    pub(super) fn local(message: String) -> Self {
        Self::new("Config", message)
    }

    /// Worth trying again soon: throttling, EC2's own failures, the network. Anything
    /// else (a bad parameter, an address in use, a limit) needs a change first; it is
    /// retried too, but slowly (see the controller's backoff).
    pub fn transient(&self) -> bool {
        matches!(
            self.code.as_str(),
            "RequestLimitExceeded"
                | "Throttling"
                | "ThrottlingException"
                | "InternalError"
                | "Unavailable"
                | "ServiceUnavailable"
                | "Unreachable"
                | "Timeout"
                | "Credentials"
        ) || self.status >= 500
    }
}

/// EC2's error document.
#[derive(Debug, Deserialize)]
struct ErrorResponse {
    #[serde(rename = "Errors")]
    errors: ErrorList,
}

#[derive(Debug, Deserialize)]
struct ErrorList {
    #[serde(rename = "Error", default)]
    error: Vec<ErrorItem>,
}

#[derive(Debug, Deserialize)]
struct ErrorItem {
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "Message", default)]
    message: String,
}

/// The error of a non-2xx answer: EC2's first error, or the body's start.
pub(crate) fn parse_error(status: u16, body: &str) -> Ec2Error {
    match quick_xml::de::from_str::<ErrorResponse>(body) {
        Ok(r) if !r.errors.error.is_empty() => {
            let e = &r.errors.error[0];
            Ec2Error { code: e.code.clone(), message: e.message.clone(), status }
        }
        _ => Ec2Error {
            code: format!("HTTP{status}"),
            message: body.chars().take(200).collect::<String>().trim().to_string(),
            status,
        },
    }
}

/// Send one request with the call's bound: (status, body).
pub(crate) async fn send(http: &HttpClient, req: http::Request<Full<Bytes>>) -> Result<(u16, String), Ec2Error> {
    let uri = req.uri().clone();
    let work = async {
        let resp = http.request(req).await.map_err(|e| Ec2Error::new("Unreachable", format!("{uri}: {e}")))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Ec2Error::new("Unreachable", format!("{uri}: reading the answer: {e}")))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(CALL_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err(Ec2Error::new("Timeout", format!("{uri}: no answer in {CALL_TIMEOUT:?}"))))
}
