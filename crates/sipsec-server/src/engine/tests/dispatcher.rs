//! The dispatcher (`mode = "dispatcher"`): new requests spread over the nodes by a hash of the
//! AOR (REGISTER) or the Call-ID, a node's keys staying with it while it is up and only its
//! keys moving when it goes down, in-dialog requests following their Route, and nothing held
//! or answered here but what is addressed to the dispatcher itself.

use super::*;
use crate::config::Route;
use crate::engine::locate::Locator;

const NODES: [&str; 3] = ["127.0.0.11:5060", "127.0.0.12:5060", "127.0.0.13:5060"];

fn dispatcher(extra: &str) -> Engine {
    let nodes: Vec<String> = NODES
        .iter()
        .map(|n| format!("{{ uri = \"sip:{n}\" }}"))
        .collect();
    engine(&format!(
        "mode = \"dispatcher\"\n[routing]\ndefault_routes = [{}]\n{extra}",
        nodes.join(", ")
    ))
}

/// Where a new request went, and what it carried.
fn first(sent: &[Sent]) -> &Sent {
    sent.iter()
        .find(|s| s.msg().is_request())
        .unwrap_or_else(|| panic!("nothing forwarded"))
}

#[test]
fn registrations_follow_the_aor_and_calls_the_call_id() {
    let mut e = dispatcher("");
    // Every REGISTER of a user lands on one node, whatever its Call-ID or Contact.
    let mut by_user = std::collections::BTreeMap::new();
    for (i, user) in ["alice", "bob", "carol", "dave", "erin", "frank"]
        .iter()
        .enumerate()
    {
        for n in 0..3 {
            let text = register(
                user,
                &format!("<sip:{user}@{ALICE}>"),
                "",
                &format!("z9hG4bK-r{i}{n}"),
                n + 1,
            )
            .replace(&format!("reg-{user}"), &format!("reg-{user}-{n}"));
            let (sent, _) = deliver(&mut e, 1, ALICE, &text);
            let to = first(&sent).to;
            assert_eq!(*by_user.entry(*user).or_insert(to), to, "{user}");
            // Forwarded, not registered here.
            assert_eq!(first(&sent).method(), Method::Register);
        }
    }
    assert_eq!(e.location.len(), 0);
    // Calls spread over all three nodes.
    let mut per_node = std::collections::BTreeMap::new();
    for i in 0..300 {
        let (sent, _) = deliver(
            &mut e,
            2,
            ALICE,
            &request(
                "INVITE",
                "sip:bob@example.test",
                &format!("z9hG4bK-c{i}"),
                "",
            ),
        );
        *per_node.entry(first(&sent).to).or_insert(0) += 1;
    }
    assert_eq!(per_node.len(), 3, "{per_node:?}");
    assert!(
        per_node.values().all(|&n| (60..=140).contains(&n)),
        "{per_node:?}"
    );
    assert_eq!(
        e.stats
            .dispatched
            .load(std::sync::atomic::Ordering::Relaxed),
        318
    );
}

#[test]
fn a_node_gone_moves_only_its_own_keys() {
    let route = |n: &str| Route {
        uri: format!("sip:{n}"),
        priority: 0,
        weight: 1,
        next: crate::config::Next::Addr(Peer::udp(addr(n))),
    };
    let all: Vec<Route> = NODES.iter().map(|n| route(n)).collect();
    let without_second: Vec<Route> = [NODES[0], NODES[2]].iter().map(|n| route(n)).collect();
    let mut moved = 0;
    for i in 0..1000 {
        let key = format!("call-{i}");
        let before = &Locator::order_routes_by_key(&all, key.as_bytes())[0].uri;
        let after = &Locator::order_routes_by_key(&without_second, key.as_bytes())[0].uri;
        if before != after {
            assert_eq!(before, &all[1].uri, "{key} moved off a node that stayed");
            moved += 1;
        }
        // The full order is the failover order: the second choice is where the key moves.
        let order = Locator::order_routes_by_key(&all, key.as_bytes());
        if before == &all[1].uri {
            assert_eq!(&order[1].uri, after);
        }
    }
    assert!(
        (250..=420).contains(&moved),
        "{moved} of 1000 keys were on the node that left"
    );
}

#[test]
fn in_dialog_requests_follow_their_route_and_options_to_the_dispatcher_is_answered() {
    let mut e = dispatcher("");
    let bye = request(
        "BYE",
        "sip:bob@127.0.0.50:5060",
        "z9hG4bK-b1",
        "Route: <sip:127.0.0.1:5060;lr>, <sip:127.0.0.13:5060;lr>\r\n",
    );
    let (sent, _) = deliver(&mut e, 1, ALICE, &bye);
    assert_eq!(first(&sent).to, addr("127.0.0.13:5060"));
    let (sent, _) = deliver(
        &mut e,
        1,
        ALICE,
        &request("OPTIONS", "sip:127.0.0.1:5060", "z9hG4bK-o1", ""),
    );
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(200));
}

#[test]
fn a_dispatcher_needs_nodes_and_holds_no_registrations() {
    let base = "[server]\nmode = \"dispatcher\"\n";
    let e = Config::from_toml(base).unwrap_err().to_string();
    assert!(e.contains("default_routes"), "{e}");
    let e = Config::from_toml(&format!(
        "{base}[routing]\ndefault_route = \"sip:127.0.0.11\"\n[database]\nurl = \"postgres://u@h/d\"\n[cluster]\nnode = \"a\"\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("holds no registrations"), "{e}");
}
