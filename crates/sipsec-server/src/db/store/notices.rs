//! The notices a cluster node's commit sends the others (PostgreSQL `NOTIFY` on
//! [`CHANNEL`], delivered when the transaction commits, never before): what the commit
//! changed, with every binding it wrote whole, so a node applies a notice without a query.
//! A commit's changes are split over as many notices as PostgreSQL's 8,000-byte payload
//! needs, each a JSON object `{"node": …, "ops": […]}`, in the order the commit wrote them
//! (remove-alls, removes, upserts: the batch's plan).
//!
//! Notices are lost while a listener is away (PostgreSQL keeps none for a session that is
//! not there), so a node that (re)connects reads the whole table instead (`cluster`).

use super::bindings::Plan;
use crate::location::{Binding, BindingChange, Outbound};
use serde::{Deserialize, Serialize};
use sipsec_transport::net::transport::Peer;
use std::sync::Arc;

/// The channel the nodes notify and listen on.
pub const CHANNEL: &str = "sipsec_location";

/// PostgreSQL refuses payloads of 8,000 bytes or more; the JSON framing is left room.
const MAX_PAYLOAD: usize = 7_900;

/// One change, as a notice carries it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op")]
enum Op {
    /// Every binding of an AOR removed.
    #[serde(rename = "A")]
    RemoveAll { aor: String },
    /// One binding removed.
    #[serde(rename = "R")]
    Remove { aor: String, contact: String },
    /// One binding written.
    #[serde(rename = "U")]
    Upsert { aor: String, b: WireBinding },
}

/// A binding as a notice carries it: the columns of `location_bindings`.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct WireBinding {
    contact: String,
    target: String,
    expires_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    q: Option<String>,
    call_id: String,
    cseq: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    received: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instance: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reg_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<String>,
}

/// How every notice of node `node` begins (its name needs no JSON escaping: letters, digits,
/// `.`, `_`, `-`): what a listener knows its own notices by without parsing them.
pub fn head(node: &str) -> String {
    format!(
        "{{\"node\":{},\"ops\":[",
        serde_json::to_string(node).unwrap_or_default()
    )
}

/// The notice payloads that tell the other nodes what `plan` wrote, for node `node`.
pub(super) fn payloads(plan: &Plan<'_>, node: &str) -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    let mut push = |op: Op| {
        // Serialising plain strings and numbers cannot fail.
        ops.extend(serde_json::to_string(&op).ok());
    };
    for aor in &plan.remove_all {
        push(Op::RemoveAll { aor: (*aor).into() });
    }
    for (aor, contact) in &plan.removes {
        push(Op::Remove {
            aor: (*aor).into(),
            contact: (*contact).into(),
        });
    }
    for (aor, b) in &plan.upserts {
        push(Op::Upsert {
            aor: (*aor).into(),
            b: WireBinding {
                contact: (*b.contact).into(),
                target: b.target.to_string(),
                expires_at: b.expires_at,
                q: b.q.as_deref().map(Into::into),
                call_id: (*b.call_id).into(),
                cseq: b.cseq,
                received: b.received.map(|r| r.to_string()),
                instance: b.outbound.as_ref().map(|o| (*o.instance).into()),
                reg_id: b.outbound.as_ref().map(|o| o.reg_id),
                path: b.path.as_deref().map(Into::into),
                via: b.via.as_deref().map(Into::into),
            },
        });
    }
    let head = head(node);
    let mut out = Vec::new();
    let mut current = head.clone();
    for op in ops {
        let fresh = current.len() == head.len();
        if !fresh && current.len() + 1 + op.len() + 2 > MAX_PAYLOAD {
            current.push_str("]}");
            out.push(std::mem::replace(&mut current, head.clone()));
        }
        if current.len() > head.len() {
            current.push(',');
        }
        current.push_str(&op);
    }
    if current.len() > head.len() {
        current.push_str("]}");
        out.push(current);
    }
    out
}

/// A notice read: the node that sent it and its changes, in order.
#[derive(Debug)]
pub struct Notice {
    /// The node whose commit it tells of.
    pub node: Arc<str>,
    /// The changes, as the node's replicas apply them: its bindings marked as its own.
    pub changes: Vec<BindingChange>,
}

#[derive(Deserialize)]
struct RawNotice {
    node: String,
    ops: Vec<Op>,
}

/// Reads a notice's payload; `None` for one that is not a notice (sent by something else on
/// the channel, or by a newer version).
pub fn parse(payload: &str) -> Option<Notice> {
    let raw: RawNotice = serde_json::from_str(payload).ok()?;
    let node: Arc<str> = raw.node.as_str().into();
    let mut changes = Vec::with_capacity(raw.ops.len());
    for op in raw.ops {
        changes.push(match op {
            Op::RemoveAll { aor } => BindingChange::RemoveAll {
                aor: aor.as_str().into(),
            },
            Op::Remove { aor, contact } => BindingChange::Remove {
                aor: aor.as_str().into(),
                contact: contact.as_str().into(),
            },
            Op::Upsert { aor, b } => BindingChange::Upsert {
                aor: aor.as_str().into(),
                binding: remote(
                    &node,
                    Columns {
                        contact: &b.contact,
                        target: &b.target,
                        expires_at: b.expires_at,
                        q: b.q.as_deref(),
                        call_id: &b.call_id,
                        cseq: b.cseq,
                        received: b.received.as_deref(),
                        instance: b.instance.as_deref(),
                        reg_id: b.reg_id,
                        path: b.path.as_deref(),
                        via: b.via.as_deref(),
                    },
                )?,
            },
        });
    }
    Some(Notice { node, changes })
}

/// A binding's columns, as read from a row or a notice.
pub(super) struct Columns<'a> {
    pub(super) contact: &'a str,
    pub(super) target: &'a str,
    pub(super) expires_at: u64,
    pub(super) q: Option<&'a str>,
    pub(super) call_id: &'a str,
    pub(super) cseq: u32,
    pub(super) received: Option<&'a str>,
    pub(super) instance: Option<&'a str>,
    pub(super) reg_id: Option<u32>,
    pub(super) path: Option<&'a str>,
    pub(super) via: Option<&'a str>,
}

impl Columns<'_> {
    /// The binding the columns say, as written: this node's own (`None` for a target that is
    /// not an address).
    pub(super) fn binding(&self) -> Option<Binding> {
        Some(Binding {
            contact: self.contact.into(),
            target: Peer::parse(self.target)?,
            expires_at: self.expires_at,
            q: self.q.map(Into::into),
            call_id: self.call_id.into(),
            cseq: self.cseq,
            received: self.received.and_then(Peer::parse),
            outbound: self
                .instance
                .zip(self.reg_id)
                .map(|(instance, reg_id)| Outbound {
                    instance: instance.into(),
                    reg_id,
                }),
            path: self.path.map(Into::into),
            node: None,
            via: self.via.map(Into::into),
        })
    }
}

/// Another node's binding as this node holds it: marked with its node, reached along that
/// node's hop (`via`, ahead of any Path, and kept as `via` to say the binding dies with that
/// node) when only that node reaches it, never as a flow of this node's. `None` when its
/// target is not an address.
pub(super) fn remote(node: &Arc<str>, c: Columns<'_>) -> Option<Binding> {
    let mut b = c.binding()?;
    b.target.flow = false;
    if let Some(via) = c.via {
        b.path = Some(match c.path {
            Some(path) => format!("{via}, {path}").into(),
            None => via.into(),
        });
    }
    b.node = Some(node.clone());
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::SharedChange;

    fn binding(contact: &str, via: Option<&str>) -> Binding {
        Binding {
            contact: contact.into(),
            target: Peer::parse("udp:198.18.0.9:5060").unwrap(),
            expires_at: 1_000_000,
            q: Some("0.5".into()),
            call_id: "c1".into(),
            cseq: 7,
            received: Peer::parse("udp:198.18.0.9:5060"),
            outbound: None,
            path: None,
            node: None,
            via: via.map(Into::into),
        }
    }

    #[test]
    fn a_commit_reads_back_as_the_same_changes_marked_with_their_node() {
        let via = "<sip:198.18.0.2:5060;lr;ob;fl=abc>";
        let changes: Vec<SharedChange> = vec![
            Arc::new(BindingChange::RemoveAll {
                aor: "sip:x@d".into(),
            }),
            Arc::new(BindingChange::Remove {
                aor: "sip:y@d".into(),
                contact: "sip:y@198.18.0.8".into(),
            }),
            Arc::new(BindingChange::Upsert {
                aor: "sip:z@d".into(),
                binding: binding("sip:z@10.0.0.1:5060", Some(via)),
            }),
        ];
        let plan = Plan::of(&changes);
        let p = payloads(&plan, "node-a");
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with(&head("node-a")) && !p[0].starts_with(&head("node")));
        let n = parse(&p[0]).unwrap();
        assert_eq!(&*n.node, "node-a");
        assert_eq!(
            n.changes[..2],
            [(*changes[0]).clone(), (*changes[1]).clone()]
        );
        let BindingChange::Upsert { aor, binding: b } = &n.changes[2] else {
            panic!("{:?}", n.changes[2]);
        };
        assert_eq!(&**aor, "sip:z@d");
        // Reached through node-a's hop, as node-a's, never as a flow here.
        assert_eq!(b.path.as_deref(), Some(via));
        assert_eq!(b.node.as_deref(), Some("node-a"));
        assert!(b.via.as_deref() == Some(via) && !b.target.flow);
        assert_eq!(
            (&*b.contact, b.cseq, b.q.as_deref()),
            ("sip:z@10.0.0.1:5060", 7, Some("0.5"))
        );
        assert!(parse("{\"node\":\"a\"}").is_none() && parse("not json").is_none());
    }

    #[test]
    fn a_large_commit_is_split_under_the_payload_limit_and_keeps_its_order() {
        let changes: Vec<SharedChange> = (0..300)
            .map(|i| {
                Arc::new(BindingChange::Upsert {
                    aor: format!("sip:user{i}@example.com").into(),
                    binding: binding(&format!("sip:user{i}@198.18.1.1:5060"), None),
                })
            })
            .collect();
        let p = payloads(&Plan::of(&changes), "a");
        assert!(p.len() > 1, "{}", p.len());
        assert!(p.iter().all(|x| x.len() < 8_000));
        let aors: Vec<String> = p
            .iter()
            .flat_map(|x| parse(x).unwrap().changes)
            .map(|c| match c {
                BindingChange::Upsert { aor, .. } => aor.to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        let want: Vec<String> = (0..300)
            .map(|i| format!("sip:user{i}@example.com"))
            .collect();
        assert_eq!(aors, want);
        assert!(payloads(&Plan::of(&[]), "a").is_empty());
    }
}
