//! The Prometheus `/metrics` endpoint on a listener rokka binds itself (so
//! `metrics.listen` may name port 0), and the ports file that reports every
//! address rokka bound.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use rokka_broker::scrape::Collectors;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long one scrape connection may stay open.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);
/// At most this many scrape connections are served at once; others wait in
/// the accept queue.
const MAX_SCRAPES: usize = 16;

/// Serves `GET /metrics` until `shutdown`, and runs the recorder's upkeep
/// (histogram buckets are drained there) every 5 s.
/// With `tls`, every scrape connection is TLS (HTTPS; with a client CA in
/// the acceptor, the scraper must present a certificate it signed).
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handle: PrometheusHandle,
    collectors: Collectors,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    let mut upkeep = tokio::time::interval(Duration::from_secs(5));
    loop {
        let permit = tokio::select! {
            p = std::sync::Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = upkeep.tick() => {
                handle.run_upkeep();
                continue;
            }
            _ = shutdown.changed() => return,
        };
        let h = handle.clone();
        let c = collectors.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| answer(req, h.clone(), c.clone()));
            let http = hyper::server::conn::http1::Builder::new();
            // One deadline for the handshake and the scrape.
            let _ = tokio::time::timeout(SCRAPE_TIMEOUT, async move {
                match tls {
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                    Some(tls) => match tls.accept(stream).await {
                        Ok(s) => {
                            metrics::counter!("rokka_metrics_tls_handshakes_total", "result" => "ok").increment(1);
                            http.serve_connection(TokioIo::new(s), service).await
                        }
                        Err(e) => {
                            metrics::counter!("rokka_metrics_tls_handshakes_total", "result" => "failed").increment(1);
                            tracing::debug!(%peer, error = %e, "metrics endpoint: TLS handshake failed");
                            Ok(())
                        }
                    },
                }
            })
            .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    handle: PrometheusHandle,
    collectors: Collectors,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut text = handle.render();
            collectors.render(&mut text);
            (StatusCode::OK, text)
        }
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n".to_string(),
        ),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if status == StatusCode::OK {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
    }
    Ok(resp)
}

/// Writes `{"kafka": "127.0.0.1:9092", ...}` to `path` atomically (a
/// temporary file renamed over it), so a reader never sees half of it.
pub fn write_ports_file(path: &Path, bound: &BTreeMap<&'static str, SocketAddr>) -> std::io::Result<()> {
    let map: BTreeMap<&str, String> = bound.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let text = serde_json::to_string_pretty(&map).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, path)
}
