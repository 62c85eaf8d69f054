//! `sipsec serve --check` and `sipsec authd --check`: a configuration loaded and validated as
//! the daemon would at start — its TLS certificates and keys read too — and what it would
//! listen on printed, one `what value` line each. Nothing is bound, no database is opened and
//! no file is created, so a check can run beside the live server it is about to reload.
//! A broken file is an error naming the key, which `main` turns into exit status 1.

use crate::authd::AuthdConfig;
use crate::config::Config;
use crate::db::store::redacted;
use anyhow::Result;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// What `sipsec serve` would run with: its listeners, metrics, control socket and database,
/// and its cluster node or the nodes it dispatches to.
pub fn serve(path: Option<&Path>) -> Result<String> {
    let cfg = match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    // What start-up builds from the file before it binds anything.
    crate::serve::reload::tls(&cfg)?;
    crate::serve::start_proxychain(&cfg)?;
    crate::serve::start_signing(&cfg)?;
    crate::serve::fetch_settings(&cfg)?;
    let mut out = header(path);
    for l in &cfg.listen {
        let _ = writeln!(out, "listen {l}");
    }
    out += &metrics(cfg.metrics_listen);
    let _ = match &cfg.control_socket {
        Some(s) => writeln!(out, "control {}", s.display()),
        None => writeln!(out, "control off"),
    };
    let _ = writeln!(out, "database {}", redacted(&cfg.database_url));
    if let Some(c) = &cfg.cluster {
        let _ = writeln!(out, "cluster node {} at {}", c.node, c.advertise);
    }
    if let Some(sign) = &cfg.identity.sign {
        let _ = writeln!(
            out,
            "identity signs with {} for {}",
            sign.key.display(),
            sign.x5u
        );
    }
    if let Some(v) = &cfg.identity.verify {
        let _ = writeln!(
            out,
            "identity verifies against {}, fetching from {}",
            v.roots.display(),
            if v.fetch_allow.is_empty() {
                "nowhere".to_string()
            } else {
                v.fetch_allow.join(", ")
            }
        );
    }
    if cfg.mode == crate::config::Mode::Dispatcher {
        let nodes: Vec<&str> = cfg
            .routing
            .default_routes
            .iter()
            .map(|r| r.uri.as_str())
            .collect();
        let _ = writeln!(out, "dispatcher over {}", nodes.join(", "));
    }
    Ok(out)
}

/// What `sipsec authd` would run with: its TLS listener, metrics and database.
pub fn authd(path: Option<&Path>) -> Result<String> {
    let (cfg, metrics_table) = AuthdConfig::load(path)?;
    crate::authd::tls(&cfg)?;
    let mut out = header(path);
    let _ = writeln!(out, "listen tls:{}", cfg.listen);
    out += &metrics(metrics_table.listen);
    let _ = writeln!(out, "database {}", redacted(&cfg.database));
    Ok(out)
}

fn header(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("config {} is valid\n", p.display()),
        None => "config: the embedded defaults (no --config)\n".into(),
    }
}

fn metrics(listen: Option<SocketAddr>) -> String {
    match listen {
        Some(a) => format!("metrics http://{a}/metrics\n"),
        None => "metrics off\n".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_names_the_cluster_node_and_the_dispatchers_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.toml");
        std::fs::write(
            &node,
            "[server]\nlisten = [\"udp:198.18.0.11:5060\"]\n\
             [database]\nurl = \"postgres://u:secret@198.18.0.10/db\"\n[cluster]\nnode = \"n1\"\n",
        )
        .unwrap();
        let out = serve(Some(&node)).unwrap();
        assert!(
            out.contains("cluster node n1 at udp:198.18.0.11:5060\n"),
            "{out}"
        );
        assert!(
            out.contains("postgres://u:***@") && !out.contains("secret"),
            "{out}"
        );
        let front = dir.path().join("front.toml");
        std::fs::write(
            &front,
            "[server]\nmode = \"dispatcher\"\n[routing]\ndefault_routes = \
             [{ uri = \"sip:198.18.0.11\" }, { uri = \"sip:198.18.0.12\" }]\n",
        )
        .unwrap();
        let out = serve(Some(&front)).unwrap();
        assert!(
            out.contains("dispatcher over sip:198.18.0.11, sip:198.18.0.12\n"),
            "{out}"
        );
        assert!(!out.contains("cluster node"), "{out}");
    }
}
