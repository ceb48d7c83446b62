//! The controller's validating admission webhook (`--webhook-listen`, the split layout,
//! docs/security.md): it lets the node identity change only what is its own node's
//! ([`egressd_core::admission`] decides), and lets everyone else through.
//!
//! * **Who**: a request of the node identity carries the pod its token is bound to
//!   (a TokenRequest token: the kubelet's projected service-account volume); the pod is
//!   read from the API server, its uid must be the token's, and its `spec.nodeName` is
//!   the node the request may speak for. A token with no pod, a pod that is gone or
//!   another pod's uid: refused.
//! * **Certificate**, with no hand step: the first replica makes a self-signed one for
//!   the Service's names (`--webhook-host`) and keeps it in a Secret
//!   (`--webhook-secret`); the others read it. The certificate is written as the
//!   `caBundle` of every webhook of the ValidatingWebhookConfiguration
//!   `--webhook-configuration`, at start and every minute (a configuration applied
//!   again by kustomize loses it; so does one created after the controller).
//! * **Serving**: HTTPS, HTTP/1, `POST /validate`, bodies up to 3 MiB (the API server's
//!   own object limit plus the review's envelope); every replica serves, leader or not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use egressd_core::admission::{Caller, NodeAgent, caller, decide, review};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;

use crate::telemetry::Telemetry;
use crate::telemetry::metrics::AdmissionLabels;

/// The largest review body read.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// How often the `caBundle` is checked.
const CA_BUNDLE_EVERY: Duration = Duration::from_secs(60);

/// The webhook's settings.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The names (DNS names or IP addresses) the certificate is for.
    pub hosts: Vec<String>,
    /// The namespace of the Secret (the controller's).
    pub namespace: String,
    /// The Secret holding the certificate and its key.
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose `caBundle` this certificate is.
    pub configuration: String,
    /// The node identity's user name (`system:serviceaccount:<namespace>:<name>`).
    pub node_user: String,
}

/// An error that stops the webhook from starting.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The certificate could not be made.
    #[error("making the webhook certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The certificate or key read back is unusable.
    #[error("the webhook certificate in Secret {0}: {1}")]
    Unusable(String, CertError),
    /// The API server refused or failed.
    #[error("webhook Secret {0}: {1}")]
    Api(String, kube::Error),
    /// The listener could not be bound.
    #[error("binding the webhook listener {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
}

/// Why a certificate and key read back cannot serve TLS.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The Secret lacks the field, or it is not UTF-8.
    #[error("no {0}")]
    Missing(String),
    /// Not PEM, or not a certificate or key.
    #[error("{0}")]
    Pem(#[from] tokio_rustls::rustls::pki_types::pem::Error),
    /// rustls refused them.
    #[error("{0}")]
    Tls(#[from] tokio_rustls::rustls::Error),
}

/// Provision the certificate, bind the listener and serve in the background; the
/// `caBundle` is kept in a task of its own.
pub async fn start(client: Client, settings: WebhookSettings, telemetry: Arc<Telemetry>) -> Result<(), WebhookError> {
    let (cert, key) = certificate(&client, &settings).await?;
    let config = tls_config(&cert, &key).map_err(|e| WebhookError::Unusable(settings.secret.clone(), e))?;
    let listener =
        tokio::net::TcpListener::bind(settings.listen).await.map_err(|e| WebhookError::Bind(settings.listen, e))?;
    tracing::info!(listen = %settings.listen, configuration = %settings.configuration, "admission webhook serving");
    tokio::spawn(keep_ca_bundle(client.clone(), settings.configuration.clone(), cert));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(serve(listener, acceptor, Judge { client, node_user: settings.node_user.into(), telemetry }));
    Ok(())
}

/// The certificate and key (PEM) from the Secret, made and stored first if it does not
/// exist (a replica that loses the race to create it reads the winner's).
async fn certificate(client: &Client, settings: &WebhookSettings) -> Result<(String, String), WebhookError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let name = &settings.secret;
    let read = |s: Secret| -> Result<(String, String), WebhookError> {
        let data = s.data.unwrap_or_default();
        let field = |k: &str| {
            data.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .ok_or_else(|| WebhookError::Unusable(name.clone(), CertError::Missing(k.to_owned())))
        };
        Ok((field("tls.crt")?, field("tls.key")?))
    };
    if let Some(s) = api.get_opt(name).await.map_err(|e| WebhookError::Api(name.clone(), e))? {
        return read(s);
    }
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(settings.hosts.clone())?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "egressd admission webhook");
    params.not_after = rcgen::date_time_ymd(2126, 1, 1);
    let cert = params.self_signed(&key)?;
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    let secret = Secret {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [("tls.crt", &cert_pem), ("tls.key", &key_pem)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %name, hosts = ?settings.hosts, "admission webhook certificate made");
            Ok((cert_pem, key_pem))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            read(api.get(name).await.map_err(|e| WebhookError::Api(name.clone(), e))?)
        }
        Err(e) => Err(WebhookError::Api(name.clone(), e)),
    }
}

fn tls_config(cert: &str, key: &str) -> Result<tokio_rustls::rustls::ServerConfig, CertError> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    Ok(tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?)
}

/// Write `cert` as the `caBundle` of every webhook of `configuration` where it is not,
/// now and every [`CA_BUNDLE_EVERY`].
async fn keep_ca_bundle(client: Client, configuration: String, cert: String) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let bundle = ByteString(cert.into_bytes());
    let mut reported = false;
    loop {
        match set_ca_bundle(&api, &configuration, &bundle).await {
            Ok(changed) => {
                if changed {
                    tracing::info!(%configuration, "admission webhook caBundle written");
                }
                reported = false;
            }
            Err(e) if !reported => {
                tracing::warn!(%configuration, error = %e, "admission webhook caBundle not written; retrying every minute");
                reported = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(CA_BUNDLE_EVERY).await;
    }
}

async fn set_ca_bundle(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    bundle: &ByteString,
) -> Result<bool, kube::Error> {
    let mut config = api.get(name).await?;
    let mut changed = false;
    for hook in config.webhooks.iter_mut().flatten() {
        if hook.client_config.ca_bundle.as_ref() != Some(bundle) {
            hook.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if changed {
        api.replace(name, &PostParams::default(), &config).await?;
    }
    Ok(changed)
}

/// What answering a review needs.
#[derive(Clone)]
struct Judge {
    client: Client,
    node_user: Arc<str>,
    telemetry: Arc<Telemetry>,
}

async fn serve(listener: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor, judge: Judge) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "admission webhook: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, judge) = (acceptor.clone(), judge.clone());
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let judge = judge.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req, &judge).await) }
            });
            let io = hyper_util::rt::TokioIo::new(tls);
            if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(error = %e, "admission webhook connection ended");
            }
        });
    }
}

async fn answer(req: Request<hyper::body::Incoming>, judge: &Judge) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
        r
    };
    if req.method() != hyper::Method::POST || req.uri().path() != "/validate" {
        return reply(StatusCode::NOT_FOUND, "{}".into());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(StatusCode::BAD_REQUEST, serde_json::json!({ "error": e.to_string() }).to_string()),
    };
    let Ok(review_request) = serde_json::from_slice::<Value>(&body) else {
        return reply(StatusCode::BAD_REQUEST, r#"{"error":"not an AdmissionReview"}"#.into());
    };
    let request = &review_request["request"];
    let who = caller(request, &judge.node_user);
    let caller_label = if who == Caller::Other { "other" } else { "node" };
    let verdict = verdict(request, who, judge).await;
    if let Err(why) = &verdict {
        tracing::warn!(
            user = request["userInfo"]["username"].as_str().unwrap_or(""),
            resource = request["resource"]["resource"].as_str().unwrap_or(""),
            name = request["name"].as_str().unwrap_or(""),
            reason = %why,
            "admission webhook refused a node agent's write"
        );
    }
    let labels = AdmissionLabels {
        caller: caller_label.into(),
        verdict: if verdict.is_ok() { "allowed" } else { "denied" }.into(),
    };
    judge.telemetry.metrics.admission_reviews.get_or_create(&labels).inc();
    reply(StatusCode::OK, review(request, &verdict).to_string())
}

/// The verdict on one request: anyone but the node identity passes; the node identity
/// speaks for the node of the pod its token is bound to.
async fn verdict(request: &Value, who: Caller, judge: &Judge) -> Result<(), String> {
    match who {
        Caller::Other => Ok(()),
        Caller::Unbound => Err(format!(
            "{} writes only with a token bound to its pod (a projected service-account token)",
            judge.node_user
        )),
        Caller::NodeAgent { namespace, pod, uid } => {
            let node = node_of(&judge.client, &namespace, &pod, &uid).await?;
            decide(request, &NodeAgent { node: &node, namespace: &namespace, pod: &pod })
        }
    }
}

/// The node of the pod a token was issued for, if the pod is still that one.
async fn node_of(client: &Client, namespace: &str, pod: &str, uid: &str) -> Result<String, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let found = api.get_opt(pod).await.map_err(|e| format!("reading pod {namespace}/{pod}: {e}"))?;
    let Some(found) = found else { return Err(format!("the token's pod {namespace}/{pod} no longer exists")) };
    if found.metadata.uid.as_deref() != Some(uid) {
        return Err(format!("the token's pod {namespace}/{pod} was replaced (uid {uid} is gone)"));
    }
    found
        .spec
        .and_then(|s| s.node_name)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("the token's pod {namespace}/{pod} runs on no node"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_that_cannot_serve_says_why() {
        let made = rcgen::generate_simple_self_signed(vec!["egressd-controller.egressd.svc".to_owned()]).unwrap();
        let (cert, key) = (made.cert.pem(), made.signing_key.serialize_pem());
        assert!(tls_config(&cert, &key).is_ok());
        // A key in place of the certificate: no certificate found, rustls refuses.
        assert!(matches!(tls_config(&key, &key), Err(CertError::Tls(_))), "{:?}", tls_config(&key, &key).err());
        // Not PEM at all.
        assert!(
            matches!(tls_config(&cert, "garbage"), Err(CertError::Pem(_))),
            "{:?}",
            tls_config(&cert, "garbage").err()
        );
        let e = WebhookError::Unusable("egressd-webhook".into(), CertError::Missing("tls.key".into()));
        assert_eq!(e.to_string(), "the webhook certificate in Secret egressd-webhook: no tls.key");
    }
}
