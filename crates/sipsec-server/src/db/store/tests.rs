//! The store's tests: URLs, the dialects' placeholders, migrations opened at once, the batch
//! plan, writes around a refused change and bindings across a reopening, on SQLite and, where
//! SIPSEC_TEST_POSTGRES / SIPSEC_TEST_MARIADB name one, on PostgreSQL and MariaDB.

use super::bindings::{placeholders, Plan};
use super::schema::SCHEMA_VERSION;
use super::{redacted, Commits, Dialect, Store};
use crate::location::{Binding, BindingChange, SharedChange};
use sqlx::Row;
use std::sync::Arc;

#[test]
fn passwords_never_reach_a_log_line() {
    assert_eq!(
        redacted("postgres://sipsec:s3cret@db.example:5432/sip"),
        "postgres://sipsec:***@db.example:5432/sip"
    );
    assert_eq!(
        redacted("mysql://u:p@ss:w@host/db?password=again&ssl-mode=required"),
        "mysql://u:***@host/db?password=***&ssl-mode=required"
    );
    assert_eq!(redacted("postgres://host/db"), "postgres://host/db");
    assert_eq!(redacted("sqlite://sipsec.db"), "sqlite://sipsec.db");
}

#[test]
fn relative_sqlite_paths_are_taken_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    assert_eq!(
        crate::config::resolve_relative("sqlite://sipsec.db", dir.path()),
        format!("sqlite://{}", base.join("sipsec.db").display())
    );
    assert_eq!(
        crate::config::resolve_relative("sqlite:data/x.db?mode=rwc", dir.path()),
        format!("sqlite://{}?mode=rwc", base.join("data/x.db").display())
    );
    for unchanged in [
        "sqlite:///var/lib/x.db",
        "sqlite::memory:",
        "postgres://h/db",
    ] {
        assert_eq!(
            crate::config::resolve_relative(unchanged, dir.path()),
            unchanged
        );
    }
}

fn binding(contact: &str, expires_at: u64) -> Binding {
    Binding {
        contact: contact.into(),
        target: sipsec_transport::net::transport::Peer::udp("127.0.0.1:5070".parse().unwrap()),
        expires_at,
        q: Some("0.7".into()),
        call_id: "call".into(),
        cseq: 3,
        received: None,
        outbound: None,
        path: None,
        node: None,
        via: None,
    }
}

#[test]
fn a_batch_is_written_as_it_ended() {
    let up = |aor: &str, contact: &str, exp| -> SharedChange {
        Arc::new(BindingChange::Upsert {
            aor: aor.into(),
            binding: binding(contact, exp),
        })
    };
    let remove = |aor: &str, contact: &str| -> SharedChange {
        Arc::new(BindingChange::Remove {
            aor: aor.into(),
            contact: contact.into(),
        })
    };
    let clear =
        |aor: &str| -> SharedChange { Arc::new(BindingChange::RemoveAll { aor: aor.into() }) };
    let changes = vec![
        up("a", "sip:1", 1),
        up("b", "sip:1", 1),
        up("a", "sip:1", 2), // a refresh: only this one is written
        remove("b", "sip:1"),
        up("c", "sip:1", 1),
        clear("c"),          // c's earlier upsert is not written
        up("c", "sip:2", 3), // but this later one is
        remove("d", "sip:9"),
    ];
    let plan = Plan::of(&changes);
    assert_eq!(plan.remove_all, vec!["c"]);
    assert_eq!(plan.removes, vec![("b", "sip:1"), ("d", "sip:9")]);
    let upserts: Vec<_> = plan
        .upserts
        .iter()
        .map(|(aor, b)| (*aor, &*b.contact, b.expires_at))
        .collect();
    assert_eq!(upserts, vec![("a", "sip:1", 2), ("c", "sip:2", 3)]);
    assert_eq!(placeholders(2, 3), "(?, ?, ?), (?, ?, ?)");
}

#[test]
fn postgres_placeholders_are_numbered() {
    assert_eq!(
        Dialect::Postgres.sql("a = ? AND b = ?"),
        "a = $1 AND b = $2"
    );
    assert_eq!(Dialect::Sqlite.sql("a = ?"), "a = ?");
}

/// Opens a fresh database from several connections at once, as `serve` and `authd`
/// started together do: each must find it migrated or migrate it, and every schema
/// version must be recorded exactly once.
async fn concurrent_first_opens(url: &str) {
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let url = url.to_string();
            tokio::spawn(async move { Store::connect(&url).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap_or_else(|e| panic!("{e:#}")));
    }
    let rows = sqlx::query("SELECT version FROM sipsec_schema ORDER BY version")
        .fetch_all(stores[0].pool())
        .await
        .unwrap();
    let versions: Vec<i64> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_fresh_sqlite_file_opened_at_once_from_several_places_is_migrated_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/fresh.db", dir.path().display());
    multi_thread().block_on(concurrent_first_opens(&url));
}

/// A namespace of its own in a network database: how to make it, reach it, remove it.
struct Fresh {
    create: Vec<String>,
    url: String,
    drop: String,
}

/// Runs `test` on the URL of a fresh namespace of the database `var` names. Making one
/// needs a right the test user may lack outside CI (`.ci/run` grants it): then the test
/// is skipped, as it is without the variable.
fn in_fresh<F: std::future::Future<Output = ()>>(
    var: &str,
    what: &str,
    fresh: impl FnOnce(&str, &str) -> Fresh,
    test: impl FnOnce(String) -> F,
) {
    let under_ci = std::env::var_os("CI").is_some();
    let Ok(base) = std::env::var(var) else {
        assert!(!under_ci, "{var} must name a database under CI");
        eprintln!("{var} not set: skipped");
        return;
    };
    let f = fresh(&base, &format!("sipsec_test_{what}_{}", std::process::id()));
    multi_thread().block_on(async {
        sqlx::any::install_default_drivers();
        let admin = sqlx::AnyPool::connect(&base).await.unwrap();
        sqlx::query(&f.drop).execute(&admin).await.ok();
        for sql in &f.create {
            if let Err(e) = sqlx::query(sql).execute(&admin).await {
                assert!(!under_ci, "{sql}: {e}");
                eprintln!("{sql}: {e}: skipped");
                return;
            }
        }
        test(f.url.clone()).await;
        sqlx::query(&f.drop).execute(&admin).await.unwrap();
    });
}

fn postgres_schema(base: &str, name: &str) -> Fresh {
    let sep = if base.contains('?') { '&' } else { '?' };
    Fresh {
        create: vec![format!("CREATE SCHEMA {name}")],
        url: format!("{base}{sep}options=-c%20search_path%3D{name}"),
        drop: format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
    }
}

fn mariadb_database(base: &str, name: &str) -> Fresh {
    let (server, _) = base.rsplit_once('/').expect("a URL ending in /database");
    Fresh {
        create: vec![format!("CREATE DATABASE {name}")],
        url: format!("{server}/{name}"),
        drop: format!("DROP DATABASE IF EXISTS {name}"),
    }
}

#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "SIPSEC_TEST_POSTGRES is not set")]
fn a_fresh_postgres_schema_opened_at_once_from_several_places_is_migrated_once() {
    in_fresh(
        "SIPSEC_TEST_POSTGRES",
        "migrate",
        postgres_schema,
        |url| async move { concurrent_first_opens(&url).await },
    );
}

#[test]
#[cfg_attr(sipsec_skip_mariadb, ignore = "SIPSEC_TEST_MARIADB is not set")]
fn a_fresh_mariadb_database_opened_at_once_from_several_places_is_migrated_once() {
    in_fresh(
        "SIPSEC_TEST_MARIADB",
        "migrate",
        mariadb_database,
        |url| async move { concurrent_first_opens(&url).await },
    );
}

/// A batch with a change the database refuses (a Contact longer than its column, which
/// the registrar would have refused at the door): the others are written, and the
/// refused one is reported instead of blocking every later batch.
async fn one_refused_change_does_not_block_the_batch(url: String) {
    let store = Store::connect(&url).await.unwrap();
    let long = format!("sip:a@{}.example", "x".repeat(600));
    let batch: Vec<SharedChange> = ["sip:a@1.2.3.4", &long, "sip:a@5.6.7.8"]
        .iter()
        .map(|c| {
            Arc::new(BindingChange::Upsert {
                aor: "a@x".into(),
                binding: binding(c, 10_000),
            })
        })
        .collect();
    let refused = store.write_isolating(&batch).await.unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].1.contains("too long"), "{}", refused[0].1);
    let loaded = store.load(0, usize::MAX).await.unwrap();
    let mut contacts: Vec<_> = loaded.bindings.iter().map(|(_, b)| &*b.contact).collect();
    contacts.sort();
    assert_eq!(contacts, ["sip:a@1.2.3.4", "sip:a@5.6.7.8"]);
    // A refresh of a stored binding updates it in place (the upsert's conflict path).
    store.write(&[refresh()]).await.unwrap();
    let mut loaded: Vec<_> = (store.load(0, usize::MAX).await.unwrap().bindings)
        .into_iter()
        .map(|(_, b)| (b.contact.to_string(), b.expires_at))
        .collect();
    loaded.sort();
    assert_eq!(
        loaded,
        [
            ("sip:a@1.2.3.4".to_string(), 20_000),
            ("sip:a@5.6.7.8".to_string(), 10_000)
        ]
    );
    // `[registrar] max_bindings` holds at start too: the bindings that live longest.
    let capped = store.load(0, 1).await.unwrap().bindings;
    assert_eq!(capped.len(), 1);
    assert_eq!(&*capped[0].1.contact, "sip:a@1.2.3.4");
}

/// a@x's binding at 1.2.3.4, refreshed to expire at 20,000.
fn refresh() -> SharedChange {
    Arc::new(BindingChange::Upsert {
        aor: "a@x".into(),
        binding: binding("sip:a@1.2.3.4", 20_000),
    })
}

#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "SIPSEC_TEST_POSTGRES is not set")]
fn postgres_writes_around_a_refused_change() {
    in_fresh(
        "SIPSEC_TEST_POSTGRES",
        "isolate",
        postgres_schema,
        one_refused_change_does_not_block_the_batch,
    );
}

#[test]
#[cfg_attr(sipsec_skip_mariadb, ignore = "SIPSEC_TEST_MARIADB is not set")]
fn mariadb_writes_around_a_refused_change() {
    in_fresh(
        "SIPSEC_TEST_MARIADB",
        "isolate",
        mariadb_database,
        one_refused_change_does_not_block_the_batch,
    );
}

/// SQLite's write is one query holding the whole transaction: a statement refused
/// part-way must leave no transaction open, or every write after it would fail.
#[test]
fn sqlite_writes_around_a_refused_change() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/loc.db", dir.path().display());
    multi_thread().block_on(async {
        let store = Store::connect(&url).await.unwrap();
        // SQLite holds text of any length; a trigger refuses long contacts as the other
        // databases' columns do.
        sqlx::query(
            "CREATE TRIGGER refuse_long BEFORE INSERT ON location_bindings \
             WHEN length(NEW.contact) > 512 BEGIN SELECT RAISE(ABORT, 'contact too long'); END",
        )
        .execute(store.pool())
        .await
        .unwrap();
        drop(store);
        one_refused_change_does_not_block_the_batch(url).await;
    });
}

/// Durable registration's store syncs every SQLite commit; write-behind's syncs at
/// checkpoints (SQLite reports FULL as 2, NORMAL as 1).
#[test]
fn sqlite_commits_are_synced_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/loc.db", dir.path().display());
    multi_thread().block_on(async {
        for (commits, expected) in [(Commits::Synced, 2), (Commits::Buffered, 1)] {
            let store = Store::connect_with(&url, commits).await.unwrap();
            let (level,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                .fetch_one(store.pool())
                .await
                .unwrap();
            assert_eq!(level, expected, "{commits:?}");
        }
    });
}

#[test]
fn bindings_survive_reopening_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/loc.db", dir.path().display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let changes: Vec<SharedChange> = vec![
            Arc::new(BindingChange::Upsert {
                aor: "a@x".into(),
                binding: binding("sip:a@1.2.3.4", 10_000),
            }),
            Arc::new(BindingChange::Upsert {
                aor: "a@x".into(),
                binding: binding("sip:a@5.6.7.8", 10_000),
            }),
            Arc::new(BindingChange::Upsert {
                aor: "b@x".into(),
                binding: binding("sip:b@1.2.3.4", 500),
            }),
            Arc::new(BindingChange::Remove {
                aor: "a@x".into(),
                contact: "sip:a@5.6.7.8".into(),
            }),
        ];
        store.write(&changes).await.unwrap();
        store.write(&[refresh()]).await.unwrap();
        drop(store);
        let store = Store::connect(&url).await.unwrap();
        let loaded = store.load(1_000, usize::MAX).await.unwrap();
        assert_eq!(
            loaded.bindings,
            vec![("a@x".to_string(), binding("sip:a@1.2.3.4", 20_000))]
        );
        let mut known = loaded.known_aors;
        known.sort();
        assert_eq!(known, vec!["a@x", "b@x"], "expired b@x is still known");
    });
}

/// A binding of a phone behind a NAT, on an outbound flow with a Path, as it comes back from
/// the database after a restart: where it registered from, its instance and reg-id and its
/// Path kept; its target still a flow, whose connection died with the process (so it is
/// answered 430/480 until the phone registers again).
async fn a_flows_fields_survive_reopening(url: String) {
    use crate::location::Outbound;
    use sipsec_transport::net::transport::{Peer, Transport};
    let received = Peer {
        transport: Transport::Tcp,
        addr: "198.51.100.7:40001".parse().unwrap(),
        conn: 5,
        flow: false,
    };
    let mut b = binding("sip:f@x7.invalid;transport=tcp;ob", 10_000);
    b.target = received.as_flow();
    b.received = Some(received);
    b.outbound = Some(Outbound {
        instance: "\"<urn:uuid:00000000-0000-1000-8000-AABBCCDDEEFF>\"".into(),
        reg_id: 2,
    });
    b.path = Some("<sip:203.0.113.5;lr;ob;fl=ab>".into());
    let store = Store::connect(&url).await.unwrap();
    let change = BindingChange::Upsert {
        aor: "flow@x".into(),
        binding: b.clone(),
    };
    store.write(&[Arc::new(change)]).await.unwrap();
    drop(store);
    let store = Store::connect(&url).await.unwrap();
    let loaded = store.load(1_000, usize::MAX).await.unwrap();
    let mut want = b;
    // The connection is gone; where it came from is still known.
    want.target = Peer::new(Transport::Tcp, received.addr).as_flow();
    want.received = Some(Peer::new(Transport::Tcp, received.addr));
    assert_eq!(loaded.bindings, vec![("flow@x".to_string(), want)]);
    assert!(loaded.bindings[0].1.target.flow_lost());
}

#[test]
fn a_flows_fields_survive_reopening_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/flow.db", dir.path().display());
    multi_thread().block_on(a_flows_fields_survive_reopening(url));
}

#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "SIPSEC_TEST_POSTGRES is not set")]
fn a_flows_fields_survive_reopening_postgres() {
    in_fresh(
        "SIPSEC_TEST_POSTGRES",
        "flow",
        postgres_schema,
        a_flows_fields_survive_reopening,
    );
}

#[test]
#[cfg_attr(sipsec_skip_mariadb, ignore = "SIPSEC_TEST_MARIADB is not set")]
fn a_flows_fields_survive_reopening_mariadb() {
    in_fresh(
        "SIPSEC_TEST_MARIADB",
        "flow",
        mariadb_database,
        a_flows_fields_survive_reopening,
    );
}
