//! A TCP relay that holds every byte for a fixed time in each direction, so a proxy and the
//! authority on one machine see a WAN round trip between them (seed 001 measured 20–68 ms
//! between Planetlab sites; its testbed put 33 ms between proxy and database). `tc netem`
//! would do this in the kernel, but it is not available on these machines.
//!
//! ```text
//! sipsec delay-relay 127.0.0.1:5071 127.0.0.1:5070 --rtt-ms 33
//! ```
//!
//! Bytes keep their order and are released no earlier than `rtt / 2` after they arrived, so
//! a request and its answer take one RTT more than without the relay, however many are in
//! flight (it delays, it does not throttle).

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `sipsec delay-relay` options.
#[derive(clap::Args, Debug)]
pub struct RelayArgs {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where to relay to.
    pub to: SocketAddr,
    /// Round-trip time added: half in each direction.
    #[arg(long, default_value_t = 33.0)]
    pub(crate) rtt_ms: f64,
}

/// Runs the relay until the process is stopped.
pub fn run(args: RelayArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        println!(
            "delay relay {} -> {}, {} ms round trip added",
            listener.local_addr()?,
            args.to,
            args.rtt_ms
        );
        serve(
            listener,
            args.to,
            Duration::from_secs_f64(args.rtt_ms / 2000.0),
        )
        .await
    })
}

/// Relays every connection accepted on `listener` to `to`, delaying each direction by
/// `one_way`.
pub async fn serve(listener: TcpListener, to: SocketAddr, one_way: Duration) -> Result<()> {
    loop {
        let (inbound, _) = listener.accept().await?;
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(to).await else {
                return;
            };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            tokio::join!(pipe(ir, ow, one_way), pipe(or, iw, one_way));
        });
    }
}

/// Copies `from` to `to`, each chunk released `delay` after it was read.
async fn pipe(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin + Send + 'static,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, data)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_round_trip_through_the_relay_takes_the_rtt() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut b = [0u8; 64];
            while let Ok(n) = s.read(&mut b).await {
                if n == 0 || s.write_all(&b[..n]).await.is_err() {
                    break;
                }
            }
        });
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(serve(relay, echo_addr, Duration::from_millis(20)));
        let mut c = TcpStream::connect(relay_addr).await.unwrap();
        for _ in 0..3 {
            let t = std::time::Instant::now();
            c.write_all(b"ping").await.unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"ping");
            let rtt = t.elapsed();
            assert!(rtt >= Duration::from_millis(40), "{rtt:?}");
            assert!(rtt < Duration::from_millis(400), "{rtt:?}");
        }
    }
}
