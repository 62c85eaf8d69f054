//! The Prometheus endpoint both daemons serve (`[metrics] listen`): `GET /metrics` answered with
//! the text exposition of a `prometheus-client` registry, over HTTP/1.1 (hyper) on the
//! daemon's async runtime, never on a worker.
//!
//! The endpoint has no authentication (bind it to a management address), so neither a flood
//! of connections nor a scraper in a tight loop may cost the server much:
//! - at most [`MAX_CONNECTIONS`] connections at once, and `MAX_PER_ADDRESS` from one IP
//!   address (so one host's idle sockets cannot lock everyone else out); more are closed as
//!   they come, and a connection is closed after [`HEADER_TIMEOUT`] without a request;
//! - the exposition is rendered at most once per `RENDER_EVERY` and the cached bytes served
//!   in between;
//! - answers are paced, one per `ANSWER_EVERY` for all connections together, in the order
//!   their requests came (a fair queue: a scraper waits behind at most one request per
//!   other connection).
//!
//! What is exposed is each daemon's business (`serve::metrics`, `authd`): their collectors read
//! counters the workers keep for themselves and sum them at scrape time, so counting costs the
//! message path one relaxed add on a cache line no other thread writes, and no lock.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The OpenMetrics text format `prometheus-client` writes (Prometheus reads it).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once; more are closed as they come, so a flood of them cannot take
/// the descriptors the SIP listeners need. A scraper needs one.
pub const MAX_CONNECTIONS: usize = 16;

/// Connections served at once from one IP address: a few Prometheus servers behind one
/// address fit, and one host cannot hold every slot.
pub(crate) const MAX_PER_ADDRESS: usize = 4;

/// How long a connection may take to send a request's headers, and may sit idle between
/// requests, before it is closed (a scraper sends its request at once).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long accepting pauses after it fails (out of descriptors).
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How long a rendered exposition is served before the counters are read again.
pub(crate) const RENDER_EVERY: Duration = Duration::from_millis(250);

/// The least time between two answers, all connections together: at most 100 scrapes a
/// second, whatever the clients do (Prometheus scrapes every 15 s by default).
pub(crate) const ANSWER_EVERY: Duration = Duration::from_millis(10);

/// What the connections share: the registry, the cached exposition, the pacing and the
/// connection counts.
struct Endpoint {
    registry: Registry,
    /// The last exposition and when it was rendered.
    rendered: Mutex<Option<(Instant, Bytes)>>,
    /// When the next answer may go.
    next_answer: Mutex<Instant>,
    /// Connections open, in all and per address.
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// A connection's place in [`Open`], given back when it closes.
struct Slot {
    endpoint: Arc<Endpoint>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.endpoint.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        if let Some(n) = open.by_address.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.by_address.remove(&self.ip);
            }
        }
    }
}

impl Endpoint {
    /// A slot for a connection from `ip`, unless the endpoint or that address is full.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let from = open.by_address.get(&ip).copied().unwrap_or(0);
        if open.total >= MAX_CONNECTIONS || from >= MAX_PER_ADDRESS {
            return None;
        }
        open.total += 1;
        *open.by_address.entry(ip).or_default() += 1;
        Some(Slot {
            endpoint: self.clone(),
            ip,
        })
    }

    /// Waits for this answer's turn: one per [`ANSWER_EVERY`], first come first served.
    async fn turn(&self) {
        let at = {
            let mut next = self.next_answer.lock().unwrap_or_else(|e| e.into_inner());
            let at = (*next).max(Instant::now());
            *next = at + ANSWER_EVERY;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }

    /// The exposition: the cached one while it is younger than [`RENDER_EVERY`].
    fn exposition(&self) -> Result<Bytes, std::fmt::Error> {
        let mut rendered = self.rendered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, bytes)) = &*rendered {
            if at.elapsed() < RENDER_EVERY {
                return Ok(bytes.clone());
            }
        }
        let mut body = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut body, &self.registry)?;
        let bytes = Bytes::from(body);
        *rendered = Some((Instant::now(), bytes.clone()));
        Ok(bytes)
    }
}

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
    let endpoint = Arc::new(Endpoint {
        registry,
        rendered: Mutex::new(None),
        next_answer: Mutex::new(Instant::now()),
        open: Mutex::new(Open::default()),
    });
    let _guard = runtime.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    runtime.spawn(async move {
        loop {
            // Out of descriptors, most likely: wait rather than spin.
            let Ok((stream, remote)) = listener.accept().await else {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            };
            // Past a cap the connection is closed at once.
            let Some(slot) = endpoint.admit(remote.ip()) else {
                continue;
            };
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| {
                    let endpoint = endpoint.clone();
                    async move {
                        endpoint.turn().await;
                        Ok::<_, std::convert::Infallible>(answer(&endpoint, &req))
                    }
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

fn answer<B>(endpoint: &Endpoint, req: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &str, body: Bytes| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, kind)
            .body(Full::new(body))
            .expect("a valid response")
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"try /metrics\n"),
        );
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"GET only\n"),
        );
    }
    match endpoint.exposition() {
        Ok(body) => reply(StatusCode::OK, CONTENT_TYPE, body),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            Bytes::from_static(b"encoding failed\n"),
        ),
    }
}

/// What one sample of a metric holds: a counter's count (`u64`) or a gauge's level (`f64`).
trait Sample {
    const KIND: MetricType;
    fn encode(&self, m: &mut MetricEncoder<'_>) -> std::fmt::Result;
}

impl Sample for u64 {
    const KIND: MetricType = MetricType::Counter;
    fn encode(&self, m: &mut MetricEncoder<'_>) -> std::fmt::Result {
        m.encode_counter::<NoLabelSet, _, u64>(self, None)
    }
}

impl Sample for f64 {
    const KIND: MetricType = MetricType::Gauge;
    fn encode(&self, m: &mut MetricEncoder<'_>) -> std::fmt::Result {
        m.encode_gauge(self)
    }
}

/// Writing metrics from counters read at scrape time: the small vocabulary the collectors
/// use on `prometheus-client`'s encoder.
pub(crate) struct Writer<'a, 'b> {
    pub(crate) enc: &'a mut DescriptorEncoder<'b>,
}

impl Writer<'_, '_> {
    /// A counter (`name` gets `_total`).
    pub(crate) fn counter(&mut self, name: &str, help: &str, value: u64) -> std::fmt::Result {
        self.sample(name, help, value)
    }

    /// A counter family: one value per label set.
    pub(crate) fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (L, u64)>,
    ) -> std::fmt::Result {
        self.family(name, help, values)
    }

    /// A gauge.
    pub(crate) fn gauge(&mut self, name: &str, help: &str, value: f64) -> std::fmt::Result {
        self.sample(name, help, value)
    }

    /// A gauge family.
    pub(crate) fn gauges<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (L, f64)>,
    ) -> std::fmt::Result {
        self.family(name, help, values)
    }

    /// A metric of one sample.
    fn sample<V: Sample>(&mut self, name: &str, help: &str, value: V) -> std::fmt::Result {
        let mut m = self.enc.encode_descriptor(name, help, None, V::KIND)?;
        value.encode(&mut m)
    }

    /// A metric family: one sample per label set.
    fn family<L: EncodeLabelSet, V: Sample>(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (L, V)>,
    ) -> std::fmt::Result {
        let mut m = self.enc.encode_descriptor(name, help, None, V::KIND)?;
        for (labels, v) in values {
            v.encode(&mut m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A histogram in seconds (`name` gets `_seconds`): per-bucket counts (not cumulative)
    /// with their upper bounds in microseconds, the last bucket unbounded.
    pub(crate) fn histogram_seconds(
        &mut self,
        name: &str,
        help: &str,
        bounds_us: &[u64],
        counts: &[u64],
        sum_us: u64,
    ) -> std::fmt::Result {
        let mut m =
            self.enc
                .encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        // Per-bucket counts: the encoder writes them cumulatively, as the format wants.
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let bound = bounds_us.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e6);
                (bound, c)
            })
            .collect();
        let count = counts.iter().sum();
        m.encode_histogram::<NoLabelSet>(sum_us as f64 / 1e6, count, &buckets, None)
    }
}
