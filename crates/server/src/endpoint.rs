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
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The connection budget of one of rokka's HTTP servers (`server` names it
/// in the metrics: "metrics", "console"): at most `max` connections served
/// at once, each for at most `timeout` (its TLS handshake included); beyond
/// the budget, new connections wait in the listener's accept queue.
pub struct ConnBudget {
    server: &'static str,
    permits: std::sync::Arc<Semaphore>,
    timeout: Duration,
}

/// A place in the budget for the next connection accepted.
pub struct ConnSlot {
    _permit: OwnedSemaphorePermit,
}

impl ConnBudget {
    /// `max` is at least 1 (the config refuses 0).
    pub fn new(server: &'static str, max: u32, timeout: Duration) -> ConnBudget {
        ConnBudget {
            server,
            permits: std::sync::Arc::new(Semaphore::new(max.max(1) as usize)),
            timeout,
        }
    }

    /// A place for the next connection, waiting while the budget is full
    /// (each such wait counted in `rokka_http_connection_budget_waits_total`).
    pub async fn acquire(&self) -> ConnSlot {
        let permit = match std::sync::Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                metrics::counter!("rokka_http_connection_budget_waits_total", "server" => self.server).increment(1);
                tracing::debug!(
                    server = self.server,
                    "HTTP connection budget full: new connections wait"
                );
                match std::sync::Arc::clone(&self.permits).acquire_owned().await {
                    Ok(p) => p,
                    // The semaphore is never closed; should it be, wait
                    // for shutdown instead of serving past the budget.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        ConnSlot { _permit: permit }
    }

    /// Runs one connection's service within the budget's deadline; one that
    /// outlives it is dropped (closed) and counted.
    pub async fn serve<F: std::future::Future>(&self, slot: ConnSlot, conn: F) {
        let open = metrics::gauge!("rokka_http_connections", "server" => self.server);
        open.increment(1.0);
        if tokio::time::timeout(self.timeout, conn).await.is_err() {
            metrics::counter!("rokka_http_connections_timed_out_total", "server" => self.server).increment(1);
            tracing::debug!(server = self.server, "HTTP connection closed at its deadline");
        }
        open.decrement(1.0);
        drop(slot);
    }
}

/// Serves `GET /metrics` until `shutdown`, and runs the recorder's upkeep
/// (histogram buckets are drained there) every 5 s.
/// With `tls`, every scrape connection is TLS (HTTPS; with a client CA in
/// the acceptor, the scraper must present a certificate it signed).
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handle: PrometheusHandle,
    collectors: Collectors,
    budget: std::sync::Arc<ConnBudget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut upkeep = tokio::time::interval(Duration::from_secs(5));
    loop {
        // The recorder's upkeep runs while the budget is full too.
        let slot = loop {
            tokio::select! {
                s = budget.acquire() => break s,
                _ = upkeep.tick() => handle.run_upkeep(),
                _ = shutdown.changed() => return,
            }
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
        let budget = std::sync::Arc::clone(&budget);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, h.clone(), c.clone()));
            let http = hyper::server::conn::http1::Builder::new();
            // One deadline for the handshake and the scrape.
            let conn = async move {
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
            };
            budget.serve(slot, conn).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: rokka\r\nConnection: close\r\n\r\n";

    async fn endpoint(max: u32, timeout: Duration) -> Result<(SocketAddr, watch::Sender<bool>), std::io::Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let (stop, stop_rx) = watch::channel(false);
        let budget = std::sync::Arc::new(ConnBudget::new("metrics", max, timeout));
        tokio::spawn(serve(listener, None, handle, Collectors::default(), budget, stop_rx));
        Ok((addr, stop))
    }

    /// Reads until the peer closes (at most 10 s).
    async fn answer_of(mut s: TcpStream) -> Result<String, Box<dyn std::error::Error>> {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await??;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test]
    async fn a_scrape_waits_while_the_budget_is_held_and_is_served_after() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _stop) = endpoint(1, Duration::from_secs(60)).await?;
        // A client that connects and sends nothing holds the one place.
        let idle = TcpStream::connect(addr).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut scrape = TcpStream::connect(addr).await?;
        scrape.write_all(GET).await?;
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(500), scrape.read(&mut byte)).await;
        assert!(early.is_err(), "answered beyond the budget of one connection");
        drop(idle);
        let text = answer_of(scrape).await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_is_closed_at_its_deadline_and_frees_its_place() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _stop) = endpoint(1, Duration::from_millis(300)).await?;
        let idle = TcpStream::connect(addr).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut scrape = TcpStream::connect(addr).await?;
        scrape.write_all(GET).await?;
        // The idle one is closed by the endpoint (EOF, nothing sent)...
        assert_eq!(answer_of(idle).await?, "");
        // ...and the waiting scrape is then answered.
        let text = answer_of(scrape).await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        Ok(())
    }
}
