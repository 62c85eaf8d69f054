//! The Prometheus endpoint both daemons serve (`[metrics] listen`): `GET /metrics` answered with
//! the text exposition of a `prometheus-client` registry, over HTTP/1.1 (hyper) on the
//! daemon's async runtime, never on a worker. At most [`MAX_CONNECTIONS`] at once, each closed
//! after [`HEADER_TIMEOUT`] without a request: the endpoint has no authentication (bind it to a
//! management address), and a flood of connections must not take the SIP listeners'
//! descriptors.
//!
//! What is exposed is each daemon's business (`serve::metrics`, `authd`): their collectors read
//! counters the workers keep for themselves and sum them at scrape time, so counting costs the
//! message path one relaxed add on a cache line no other thread writes, and no lock.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::net::SocketAddr;
use std::sync::Arc;

/// The OpenMetrics text format `prometheus-client` writes (Prometheus reads it).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once; more are closed as they come, so a flood of them cannot take
/// the descriptors the SIP listeners need. A scraper needs one.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a connection may take to send a request's headers, and may sit idle between
/// requests, before it is closed (a scraper sends its request at once).
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long accepting pauses after it fails (out of descriptors).
pub const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Binds `addr` now (so a taken address stops the daemon at start) and serves `registry` there
/// on `runtime`'s threads. Returns the address bound (for port 0).
pub fn serve(
    runtime: &tokio::runtime::Handle,
    addr: SocketAddr,
    registry: Registry,
) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("metrics.listen: cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let registry = Arc::new(registry);
    let _guard = runtime.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    runtime.spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors, most likely: wait rather than spin.
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // Past the cap the connection is closed at once.
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&registry, &req)) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn answer<B>(registry: &Registry, req: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &str, body: String| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, kind)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into());
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    let mut body = String::with_capacity(16 * 1024);
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => reply(StatusCode::OK, CONTENT_TYPE, body),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "encoding failed\n".into(),
        ),
    }
}

/// Writing metrics from counters read at scrape time: the small vocabulary the collectors
/// use on `prometheus-client`'s encoder.
pub struct Writer<'a, 'b> {
    pub enc: &'a mut DescriptorEncoder<'b>,
}

impl Writer<'_, '_> {
    /// A counter (`name` gets `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> std::fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        m.encode_counter::<NoLabelSet, _, u64>(&value, None)
    }

    /// A counter family: one value per label set.
    pub fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (L, u64)>,
    ) -> std::fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, v) in values {
            m.encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
        Ok(())
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> std::fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        m.encode_gauge(&value)
    }

    /// A gauge family.
    pub fn gauges<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (L, f64)>,
    ) -> std::fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in values {
            m.encode_family(&labels)?.encode_gauge(&v)?;
        }
        Ok(())
    }

    /// A histogram in seconds (`name` gets `_seconds`): per-bucket counts (not cumulative)
    /// with their upper bounds in milliseconds, the last bucket unbounded.
    pub fn histogram_seconds(
        &mut self,
        name: &str,
        help: &str,
        bounds_ms: &[u64],
        counts: &[u64],
        sum_ms: u64,
    ) -> std::fmt::Result {
        let mut m =
            self.enc
                .encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        // Per-bucket counts: the encoder writes them cumulatively, as the format wants.
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let bound = bounds_ms
                    .get(i)
                    .map_or(f64::INFINITY, |&b| b as f64 / 1000.0);
                (bound, c)
            })
            .collect();
        let count = counts.iter().sum();
        m.encode_histogram::<NoLabelSet>(sum_ms as f64 / 1000.0, count, &buckets, None)
    }
}
