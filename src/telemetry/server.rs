//! The health listener: `/healthz` (the process answers and every part of it works: 503
//! naming a part that stopped — the DNS snooping listener — or a sync stuck for over
//! two minutes), `/readyz` (first complete sync
//! applied and prerequisites met; 503 with the named reasons otherwise; `note:` lines for
//! what does not block readiness, such as a kind whose CRD is not installed) and `/metrics`.
//! Default address 127.0.0.1:9780 (probes use `host: 127.0.0.1` with hostNetwork).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::Telemetry;

async fn healthz(State(t): State<Arc<Telemetry>>) -> impl IntoResponse {
    match t.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reasons) => (StatusCode::SERVICE_UNAVAILABLE, format!("not alive:\n{}\n", reasons.join("\n"))),
    }
}

async fn readyz(State(t): State<Arc<Telemetry>>) -> impl IntoResponse {
    match t.health.readiness() {
        Ok(()) => {
            let notes: String = t.health.notes().iter().map(|n| format!("note: {n}\n")).collect();
            (StatusCode::OK, format!("ok\n{notes}"))
        }
        Err(reasons) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready:\n{}\n", reasons.join("\n"))),
    }
}

async fn metrics(State(t): State<Arc<Telemetry>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], t.metrics.encode())
}

/// Bind `addr` and serve until the runtime stops. Binding errors are returned at once.
pub async fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(telemetry);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health listener stopped");
        }
    });
    Ok(())
}
