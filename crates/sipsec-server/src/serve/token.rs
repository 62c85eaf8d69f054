//! The epoll tokens of a worker's descriptors, in one place: the worker's own (UDP sockets,
//! mailbox) and its connection table's (listeners, connections). The kind is in the high 32
//! bits, the index in the low.

const UDP: u64 = 0;
const MAILBOX: u64 = 1 << 32;
const LISTENER: u64 = 2 << 32;
const CONNECTION: u64 = 3 << 32;
const KIND: u64 = 0xffff_ffff << 32;

/// What a descriptor in a worker's epoll set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// UDP socket `i` of the worker, in listen order.
    Udp(usize),
    /// The worker's mailbox.
    Mailbox,
    /// TCP or TLS listener `i` of the worker's connection table.
    Listener(usize),
    /// The connection in slot `i` of the worker's connection table.
    Connection(usize),
}

impl Token {
    /// The `u64` epoll carries for this descriptor.
    pub fn encode(self) -> u64 {
        match self {
            Token::Udp(i) => UDP | i as u64,
            Token::Mailbox => MAILBOX,
            Token::Listener(i) => LISTENER | i as u64,
            Token::Connection(i) => CONNECTION | i as u64,
        }
    }

    /// The descriptor a `u64` from epoll names; `None` for a kind no token has.
    pub fn decode(token: u64) -> Option<Token> {
        let index = (token & !KIND) as usize;
        match token & KIND {
            UDP => Some(Token::Udp(index)),
            MAILBOX => Some(Token::Mailbox),
            LISTENER => Some(Token::Listener(index)),
            CONNECTION => Some(Token::Connection(index)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::Udp(0),
            Token::Udp(7),
            Token::Mailbox,
            Token::Listener(3),
            Token::Connection(0xff_fffe),
        ] {
            assert_eq!(Token::decode(t.encode()), Some(t));
        }
        assert_eq!(Token::decode(9 << 32), None);
    }
}
