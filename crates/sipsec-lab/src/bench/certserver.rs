//! `sipsec cert-server`: the HTTPS server a STIR/SHAKEN verifier fetches signing certificates
//! from (a token's `x5u`), for the bench, the lab and tests — what a carrier's certificate
//! repository is, with none of its operations: the files of one directory, by name, over
//! HTTP/1.1 on rustls, each with `Cache-Control: max-age` so a verifier's cache is exercised
//! as a real repository would exercise it.
//!
//! ```text
//! sipsec certs --shaken --out certs
//! sipsec cert-server --dir certs --listen 127.0.0.1:35443
//! # x5u = https://127.0.0.1:35443/shaken.pem
//! ```
//!
//! Only plain file names are served (`/shaken.pem`; no `..`, no sub-directories, no hidden
//! files); anything else is 404, a method other than GET or HEAD 405. It prints one line when
//! it listens and runs until it is stopped.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{header, Method, Request, Response, StatusCode};
use sipsec_transport::tls::{self, certs, ClientAuth, Protocol, ServerSide};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A connection that has not finished its TLS handshake and request in this long is closed.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// `sipsec cert-server` options.
#[derive(clap::Args, Debug, Clone)]
pub struct CertServerArgs {
    /// Where to listen (HTTPS).
    #[arg(long, default_value = "127.0.0.1:35443")]
    pub listen: SocketAddr,
    /// The directory whose files are served, by name (`sipsec certs --shaken --out DIR`).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The server's TLS certificate (PEM; default: DIR/server.pem, which `sipsec certs`
    /// makes for localhost and 127.0.0.1 to 127.0.0.3).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM; default: DIR/server-key.pem).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// `Cache-Control: max-age` of every answer, in seconds (0: `no-store`, so a verifier
    /// fetches per use).
    #[arg(long, default_value_t = 3600)]
    pub max_age_s: u64,
}

/// Runs the server until the process is stopped.
pub fn run(a: CertServerArgs) -> Result<()> {
    let side = ServerSide {
        cert: a.cert.clone().unwrap_or_else(|| a.dir.join(certs::SERVER)),
        key: a
            .key
            .clone()
            .unwrap_or_else(|| a.dir.join(certs::SERVER_KEY)),
        ca: None,
        client_auth: ClientAuth::None,
        protocol: Protocol::default(),
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config(&side)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        println!(
            "cert server on https://{}/ serving {}",
            listener.local_addr()?,
            a.dir.display()
        );
        let files = Arc::new(Files {
            dir: a.dir,
            max_age_s: a.max_age_s,
        });
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            // Each TLS flight and answer at once, not after the client's delayed ACK.
            let _ = socket.set_nodelay(true);
            let (acceptor, files) = (acceptor.clone(), files.clone());
            tokio::spawn(async move {
                let serve = async {
                    let stream = acceptor.accept(socket).await.ok()?;
                    let service = hyper::service::service_fn(move |r| {
                        let files = files.clone();
                        async move { Ok::<_, std::convert::Infallible>(files.answer(&r)) }
                    });
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await
                        .ok()
                };
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, serve).await;
            });
        }
    })
}

/// The directory served, and how long answers may be cached.
struct Files {
    dir: PathBuf,
    max_age_s: u64,
}

impl Files {
    /// The answer to `request`.
    fn answer<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        let status = |code: StatusCode| {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = code;
            r
        };
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return status(StatusCode::METHOD_NOT_ALLOWED);
        }
        let Some(path) = file_in(&self.dir, request.uri().path()) else {
            return status(StatusCode::NOT_FOUND);
        };
        let Ok(body) = std::fs::read(&path) else {
            return status(StatusCode::NOT_FOUND);
        };
        let cache = if self.max_age_s == 0 {
            "no-store".to_string()
        } else {
            format!("max-age={}", self.max_age_s)
        };
        let mut r = Response::new(Full::new(Bytes::from(body)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/pem-certificate-chain"),
        );
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_str(&cache).expect("ASCII"),
        );
        r
    }
}

/// The file of `dir` that the request path `path` names: one plain file name (letters,
/// digits, `-`, `_` and `.`, not starting with a dot), nothing else.
fn file_in(dir: &Path, path: &str) -> Option<PathBuf> {
    let name = path.strip_prefix('/')?;
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    plain.then(|| dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::file_in;
    use std::path::Path;

    #[test]
    fn only_plain_file_names_are_served() {
        let dir = Path::new("/srv/certs");
        assert_eq!(file_in(dir, "/shaken.pem"), Some(dir.join("shaken.pem")));
        for bad in [
            "/",
            "",
            "shaken.pem",
            "/../etc/passwd",
            "/a/b.pem",
            "/.hidden",
            "/%2e%2e",
            "/a b",
            "/..",
        ] {
            assert_eq!(file_in(dir, bad), None, "{bad:?}");
        }
    }
}
