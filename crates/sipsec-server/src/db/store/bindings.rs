//! The bindings in the database: loading them at start, and writing a batch of changes as
//! its plan (the batch's final state) turned into a few statements in one transaction, the
//! bindings in multi-row upserts; a change the database refuses is isolated from the rest.

use super::notices::{self, Columns};
use super::{Dialect, Store};
use crate::location::{Binding, BindingChange, SharedChange};
use anyhow::Result;
use sqlx::any::AnyRow;
use sqlx::Row;

/// A binding row's columns, in the order `Store::binding_of` reads them.
const BINDING_COLUMNS: &str = "aor, contact, target, expires_at, q, call_id, cseq, received, \
     flow, instance, reg_id, path, node, via";

/// What the server loads at start.
pub struct Loaded {
    /// The live bindings, each with its AOR, latest to expire first.
    pub bindings: Vec<(String, Binding)>,
    pub(crate) known_aors: Vec<String>,
}

impl Store {
    /// Loads live bindings, at most `max_bindings` (`[registrar] max_bindings`: those that
    /// live longest), and known AORs; expired rows are deleted on the way.
    pub async fn load(&self, now_unix_ms: u64, max_bindings: usize) -> Result<Loaded> {
        self.delete_expired(now_unix_ms).await?;
        let limit = max_bindings.min(i64::MAX as usize);
        let rows: Vec<AnyRow> = sqlx::query(&format!(
            "SELECT {BINDING_COLUMNS} FROM location_bindings \
             ORDER BY expires_at DESC LIMIT {limit}"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut bindings = Vec::with_capacity(rows.len());
        for r in &rows {
            bindings.extend(self.binding_of(r)?);
        }
        let known_aors = sqlx::query("SELECT aor FROM location_aors")
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        Ok(Loaded {
            bindings,
            known_aors,
        })
    }

    /// A row of `location_bindings` (selected as [`BINDING_COLUMNS`]) as this node holds
    /// it: its own binding, or another cluster node's; `None` for a target that is not an
    /// address.
    fn binding_of(&self, r: &AnyRow) -> Result<Option<(String, Binding)>> {
        let aor: String = r.try_get(0)?;
        let target: String = r.try_get(2)?;
        let received: Option<String> = r.try_get(7)?;
        let instance: Option<String> = r.try_get(9)?;
        let reg_id: Option<i64> = r.try_get(10)?;
        let path: Option<String> = r.try_get(11)?;
        let q: Option<String> = r.try_get(4)?;
        let node: Option<String> = r.try_get(12)?;
        let via: Option<String> = r.try_get(13)?;
        let columns = Columns {
            contact: &r.try_get::<String, _>(1)?,
            target: &target,
            expires_at: r.try_get::<i64, _>(3)? as u64,
            q: q.as_deref(),
            call_id: &r.try_get::<String, _>(5)?,
            cseq: r.try_get::<i64, _>(6)? as u32,
            received: received.as_deref(),
            instance: instance.as_deref(),
            reg_id: reg_id.map(|id| u32::try_from(id).unwrap_or(0)),
            path: path.as_deref(),
            via: via.as_deref(),
        };
        let binding = match node {
            // Another cluster node's.
            Some(node) if self.node.as_deref().is_some_and(|me| *me != *node) => {
                match notices::remote(&node.into(), columns) {
                    Some(b) => b,
                    None => return Ok(None),
                }
            }
            _ => {
                let Some(mut b) = columns.binding() else {
                    return Ok(None);
                };
                if r.try_get::<i64, _>(8)? != 0 {
                    // Its connection died with the process that held it: a stream flow
                    // answers 430/480 until the phone registers again.
                    b.target = b.target.as_flow();
                }
                b
            }
        };
        Ok(Some((aor, binding)))
    }

    /// In a cluster, every live binding the other nodes hold: what a node that (re)connects
    /// to the shared table replaces its replicas' view of them with.
    pub async fn other_nodes_bindings(&self, now_unix_ms: u64) -> Result<Vec<(String, Binding)>> {
        let Some(me) = &self.node else {
            return Ok(Vec::new());
        };
        let rows: Vec<AnyRow> = sqlx::query(&self.dialect.sql(&format!(
            "SELECT {BINDING_COLUMNS} FROM location_bindings \
             WHERE node IS NOT NULL AND node <> ? AND expires_at > ?"
        )))
        .bind(&**me)
        .bind(now_unix_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.extend(self.binding_of(r)?);
        }
        Ok(out)
    }

    /// Applies a batch in one transaction; if that fails while the database answers, applies
    /// its changes one by one, so a change the database refuses (a value its columns cannot
    /// hold) cannot hold up the others. Returns the refused changes with why, and fails only
    /// when the database does not answer (the batch is then to be retried whole).
    pub(crate) async fn write_isolating(
        &self,
        changes: &[SharedChange],
    ) -> Result<Vec<(SharedChange, String)>> {
        let Err(batch_error) = self.write(changes).await else {
            return Ok(Vec::new());
        };
        let mut refused = Vec::new();
        for change in changes {
            if let Err(e) = self.write(std::slice::from_ref(change)).await {
                if !self.answers().await {
                    return Err(batch_error);
                }
                refused.push((change.clone(), format!("{e:#}")));
            }
        }
        Ok(refused)
    }

    /// Applies a batch of changes in one transaction: the batch's final state, in a few
    /// statements (see `Plan`), the bindings in multi-row upserts rather than three
    /// statements each. On SQLite the whole transaction goes to sqlx's SQLite thread as one
    /// query, one round trip (a wake-up of each thread) instead of one per statement; the
    /// other databases take the statements one by one inside a transaction.
    pub async fn write(&self, changes: &[SharedChange]) -> Result<()> {
        let statements = Plan::of(changes).statements(self.dialect, self.node.as_deref());
        if self.dialect == Dialect::Sqlite {
            let mut sql = String::from("BEGIN;\n");
            for s in &statements {
                sql.push_str(&s.sql);
                sql.push_str(";\n");
            }
            sql.push_str("COMMIT");
            let mut query = sqlx::query(&sql);
            for s in &statements {
                for arg in &s.args {
                    query = arg.bind(query);
                }
            }
            let mut conn = self.pool.acquire().await?;
            if let Err(e) = query.execute(&mut *conn).await {
                // A statement failed part-way: the transaction it began is still open.
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return Err(e.into());
            }
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for s in &statements {
            let mut query = sqlx::query(&s.sql);
            for arg in &s.args {
                query = arg.bind(query);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// One SQL statement of a write and the values for its placeholders, in order.
struct Statement<'c> {
    sql: String,
    args: Vec<Arg<'c>>,
}

/// A value bound to a placeholder.
enum Arg<'c> {
    Text(&'c str),
    Owned(String),
    MaybeText(Option<&'c str>),
    MaybeOwned(Option<String>),
    Int(i64),
    MaybeInt(Option<i64>),
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

impl<'c> Arg<'c> {
    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        match self {
            Arg::Text(t) => query.bind(*t),
            Arg::Owned(t) => query.bind(t.as_str()),
            Arg::MaybeText(t) => query.bind(*t),
            Arg::MaybeOwned(t) => query.bind(t.as_deref()),
            Arg::Int(n) => query.bind(*n),
            Arg::MaybeInt(n) => query.bind(*n),
        }
    }
}

/// Bindings per upsert statement: `COLUMNS` values each stays far below every database's
/// limit on bound values (SQLite's is 32,766, PostgreSQL's and MySQL's 65,535).
const ROWS_PER_STATEMENT: usize = 500;
/// Values per binding row.
const COLUMNS: usize = 14;

/// `(?, ?), (?, ?)`: `rows` rows of `columns` placeholders.
pub(super) fn placeholders(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// What a batch leaves behind, as the statements to write it: a binding changed several
/// times in a batch is written once, as it ended, and nothing changed before a `RemoveAll`
/// of its AOR is written at all. Run in this order: remove-alls, removes, upserts.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan<'c> {
    pub(super) remove_all: Vec<&'c str>,
    pub(super) removes: Vec<(&'c str, &'c str)>,
    pub(super) upserts: Vec<(&'c str, &'c Binding)>,
}

impl<'c> Plan<'c> {
    pub(super) fn of(changes: &'c [SharedChange]) -> Plan<'c> {
        use std::collections::HashSet;
        let mut plan = Plan::default();
        // Newest first: the first change met for a binding is its final state.
        let mut cleared: HashSet<&str> = HashSet::new();
        let mut settled: HashSet<(&str, &str)> = HashSet::new();
        for change in changes.iter().rev() {
            match &**change {
                BindingChange::RemoveAll { aor } => {
                    if cleared.insert(aor) {
                        plan.remove_all.push(aor);
                    }
                }
                BindingChange::Upsert { aor, binding } => {
                    if !cleared.contains(&**aor) && settled.insert((aor, &binding.contact)) {
                        plan.upserts.push((aor, binding));
                    }
                }
                BindingChange::Remove { aor, contact } => {
                    if !cleared.contains(&**aor) && settled.insert((aor, contact)) {
                        plan.removes.push((aor, contact));
                    }
                }
            }
        }
        // Oldest first again, as the changes came.
        plan.remove_all.reverse();
        plan.removes.reverse();
        plan.upserts.reverse();
        plan
    }

    /// The statements that write the plan, in the order they must run; in a cluster (`node`,
    /// this node's name), the bindings marked as this node's, and the notices that tell the
    /// other nodes, sent as the transaction commits.
    fn statements(&self, d: Dialect, node: Option<&'c str>) -> Vec<Statement<'c>> {
        let mut out = Vec::new();
        for aor in &self.remove_all {
            out.push(Statement {
                sql: d.sql("DELETE FROM location_bindings WHERE aor = ?"),
                args: vec![Arg::Text(aor)],
            });
        }
        for (aor, contact) in &self.removes {
            out.push(Statement {
                sql: d.sql("DELETE FROM location_bindings WHERE aor = ? AND contact = ?"),
                args: vec![Arg::Text(aor), Arg::Text(contact)],
            });
        }
        let (insert, ignore_suffix) = match d {
            Dialect::MySql => ("INSERT IGNORE INTO", ""),
            Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        };
        let update = match d {
            Dialect::MySql => {
                " ON DUPLICATE KEY UPDATE target = VALUES(target), \
                 expires_at = VALUES(expires_at), q = VALUES(q), \
                 call_id = VALUES(call_id), cseq = VALUES(cseq), received = VALUES(received), \
                 flow = VALUES(flow), instance = VALUES(instance), reg_id = VALUES(reg_id), \
                 path = VALUES(path), node = VALUES(node), via = VALUES(via)"
            }
            Dialect::Sqlite | Dialect::Postgres => {
                " ON CONFLICT (aor, contact) DO UPDATE SET target = excluded.target, \
                 expires_at = excluded.expires_at, q = excluded.q, \
                 call_id = excluded.call_id, cseq = excluded.cseq, \
                 received = excluded.received, flow = excluded.flow, \
                 instance = excluded.instance, reg_id = excluded.reg_id, path = excluded.path, \
                 node = excluded.node, via = excluded.via"
            }
        };
        for rows in self.upserts.chunks(ROWS_PER_STATEMENT) {
            let mut aors: Vec<&str> = rows.iter().map(|(aor, _)| *aor).collect();
            aors.sort_unstable();
            aors.dedup();
            out.push(Statement {
                sql: d.sql(&format!(
                    "{insert} location_aors (aor) VALUES {}{ignore_suffix}",
                    placeholders(aors.len(), 1)
                )),
                args: aors.into_iter().map(Arg::Text).collect(),
            });
            let mut args = Vec::with_capacity(rows.len() * COLUMNS);
            for (aor, binding) in rows {
                let ob = binding.outbound.as_ref();
                args.extend([
                    Arg::Text(aor),
                    Arg::Text(&binding.contact),
                    Arg::Owned(binding.target.to_string()),
                    Arg::Int(binding.expires_at as i64),
                    Arg::MaybeText(binding.q.as_deref()),
                    Arg::Text(&binding.call_id),
                    Arg::Int(i64::from(binding.cseq)),
                    Arg::MaybeOwned(binding.received.map(|p| p.to_string())),
                    Arg::Int(i64::from(binding.target.flow)),
                    Arg::MaybeText(ob.map(|o| &*o.instance)),
                    Arg::MaybeInt(ob.map(|o| i64::from(o.reg_id))),
                    Arg::MaybeText(binding.path.as_deref()),
                    Arg::MaybeText(node),
                    Arg::MaybeText(binding.via.as_deref()),
                ]);
            }
            out.push(Statement {
                sql: d.sql(&format!(
                    "INSERT INTO location_bindings (aor, contact, target, expires_at, q, \
                     call_id, cseq, received, flow, instance, reg_id, path, node, via) \
                     VALUES {}{update}",
                    placeholders(rows.len(), COLUMNS)
                )),
                args,
            });
        }
        if let Some(node) = node.filter(|_| d == Dialect::Postgres) {
            for payload in notices::payloads(self, node) {
                out.push(Statement {
                    sql: d.sql(&format!("SELECT pg_notify('{}', ?)", notices::CHANNEL)),
                    args: vec![Arg::Owned(payload)],
                });
            }
        }
        out
    }
}
