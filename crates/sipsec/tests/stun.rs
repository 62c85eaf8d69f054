//! STUN on the UDP SIP port (RFC 5626 §4.4.1 and §8, RFC 5389): a Binding request sent to a
//! running server is answered from the port it was sent to, with the transaction id and the
//! address the client sends from in XOR-MAPPED-ADDRESS, decoded here by hand from the RFC;
//! STUN that is not a Binding request gets nothing, and both are counted.

mod common;

use common::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

const MAGIC_COOKIE: u32 = 0x2112_A442;

/// A STUN header (RFC 5389 §6) with no attributes: `kind`, length 0, the cookie, `id`.
fn stun(kind: u16, id: [u8; 12]) -> Vec<u8> {
    let mut m = Vec::with_capacity(20);
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&MAGIC_COOKIE.to_be_bytes());
    m.extend_from_slice(&id);
    m
}

/// The transaction id and XOR-MAPPED-ADDRESS (RFC 5389 §15.2, IPv4) of a Binding success
/// response, walking its attributes.
fn decode_success(r: &[u8]) -> ([u8; 12], SocketAddr) {
    assert!(r.len() >= 20, "{r:?}");
    assert_eq!(u16::from_be_bytes([r[0], r[1]]), 0x0101, "Binding success");
    let length = usize::from(u16::from_be_bytes([r[2], r[3]]));
    assert_eq!(r.len(), 20 + length);
    assert_eq!(r[4..8], MAGIC_COOKIE.to_be_bytes());
    let id: [u8; 12] = r[8..20].try_into().unwrap();
    let mut at = 20;
    while at + 4 <= r.len() {
        let kind = u16::from_be_bytes([r[at], r[at + 1]]);
        let len = usize::from(u16::from_be_bytes([r[at + 2], r[at + 3]]));
        let value = &r[at + 4..at + 4 + len];
        if kind == 0x0020 {
            assert_eq!(value[1], 0x01, "IPv4 family");
            let port = u16::from_be_bytes([value[2], value[3]]) ^ (MAGIC_COOKIE >> 16) as u16;
            let ip = u32::from_be_bytes(value[4..8].try_into().unwrap()) ^ MAGIC_COOKIE;
            return (id, SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port));
        }
        at += 4 + len.div_ceil(4) * 4;
    }
    panic!("no XOR-MAPPED-ADDRESS in {r:?}");
}

#[test]
fn a_binding_request_on_the_sip_port_is_answered_with_the_address_seen() {
    let dir = tempfile::tempdir().unwrap();
    let sip = ports(20500);
    let server = Server::start_logged(
        dir.path(),
        &format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{sip}\"]\nworkers = 2\n\
             [database]\nurl = \"sqlite://{}\"\n",
            dir.path().join("stun.db").display()
        ),
    );
    let server_addr: SocketAddr = format!("127.0.0.1:{sip}").parse().unwrap();
    let client = UdpSocket::bind("127.0.0.5:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 1500];
    for round in 0..3u8 {
        let id = [round, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        client.send_to(&stun(0x0001, id), server_addr).unwrap();
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, server_addr, "answered from the socket it was sent to");
        assert_eq!(
            decode_success(&buf[..n]),
            (id, client.local_addr().unwrap())
        );
    }
    // A Binding indication and an Allocate request (TURN) are STUN, but not ours: dropped.
    client.send_to(&stun(0x0011, [7; 12]), server_addr).unwrap();
    client.send_to(&stun(0x0003, [8; 12]), server_addr).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(client.recv_from(&mut buf).is_err(), "nothing answers them");
    // SIP on the same socket still works after them.
    let options = format!(
        "OPTIONS sip:127.0.0.1:{sip} SIP/2.0\r\nVia: SIP/2.0/UDP {};branch=z9hG4bKstun\r\n\
         Max-Forwards: 70\r\nFrom: <sip:a@localhost>;tag=1\r\nTo: <sip:127.0.0.1:{sip}>\r\n\
         Call-ID: stun-1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
        client.local_addr().unwrap()
    );
    client.send_to(options.as_bytes(), server_addr).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"SIP/2.0 "), "{:?}", &buf[..n]);
    let counters = server.stop_counters();
    assert_eq!(counters.get("stun_answered"), 3);
    assert_eq!(counters.get("stun_dropped"), 2);
    assert_eq!(
        counters.get("malformed"),
        0,
        "STUN never reaches the SIP parser"
    );
}
