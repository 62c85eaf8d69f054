//! Memory of the proxy's Proxychain credential cache holding N credentials: the process's
//! resident memory before and after filling the same `ChainCache` the proxy uses, per
//! credential, beside the structure's own estimate (`bytes_per_credential`). The issue's
//! bar: 1,000,000 credentials in under 200 MB; the paper's figure is 134 B each with MD5.
//!
//!     cargo run --release --example chain_cache_memory [N=1000000] [SHA-256|MD5]

use sip_core::proxychain::{issue, HashKind};
use sipsec_server::auth::chains::ChainCache;

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.parse().expect("N is a number"));
    let hash = std::env::args().nth(2).map_or(HashKind::Sha256, |h| {
        HashKind::from_token(h.as_bytes()).expect("SHA-256 or MD5")
    });
    let template = issue(hash, &[7; 32], "proxy-1", 10, [1; 16], [2; 16]);
    let names: Vec<String> = (0..n).map(|i| format!("user{i:07}")).collect();
    let before = rss();
    let cache = ChainCache::new(n);
    for (i, name) in names.iter().enumerate() {
        let mut chain: sip_core::proxychain::Chain = template.clone().into();
        // Distinct values, as real chains have (nothing here is shared or compressed).
        chain.n_da[..8].copy_from_slice(&(i as u64).to_be_bytes());
        cache.install(name, chain, 0, 0);
    }
    let after = rss();
    assert_eq!(cache.len(), n);
    let per = (after - before) as f64 / n as f64;
    println!(
        "{n} {} credentials: {:.1} MiB resident ({per:.0} B each; the structure's estimate {} B)",
        hash.token(),
        (after - before) as f64 / (1 << 20) as f64,
        cache.bytes_per_credential(names[0].len())
    );
}
