//! Stream framing on any bytes, split into reads at arbitrary points: the framer must never
//! claim more bytes than it has, never loop without consuming, and frame the same bytes the
//! same way however they arrived. Invariant: no panic, and each frame lies within the buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sip_core::message::framing::{next_frame, Frame};

const MAX: usize = 4096;

/// Frames `chunks` read one after another; returns the frames and why it stopped.
fn frames(chunks: &[&[u8]]) -> (Vec<(usize, bool)>, Option<Frame>) {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match next_frame(&buf, MAX) {
                Frame::Incomplete => break,
                Frame::KeepAlive { len, .. } => {
                    assert!(len > 0 && len <= buf.len());
                    out.push((len, false));
                    buf.drain(..len);
                }
                Frame::Message(len) => {
                    assert!(len > 0 && len <= buf.len(), "{len} of {}", buf.len());
                    assert!(len <= MAX + 4, "a message over the limit: {len}");
                    out.push((len, true));
                    buf.drain(..len);
                }
                Frame::Ambiguous(head) => {
                    // Two Content-Lengths: the head to answer 400 lies within the buffer.
                    assert!(head > 0 && head <= buf.len(), "{head} of {}", buf.len());
                    return (out, Some(Frame::Ambiguous(head)));
                }
                stop @ (Frame::TooLarge | Frame::Invalid(_)) => return (out, Some(stop)),
            }
        }
        assert!(buf.len() <= MAX + 4 + 65_536, "buffered without bound");
    }
    (out, None)
}

fuzz_target!(|input: (Vec<u8>, Vec<u16>)| {
    let (data, cuts) = input;
    let whole = frames(&[&data]);
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| *c as usize % (data.len() + 1))
        .collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut at = 0;
    for p in points {
        chunks.push(&data[at..p]);
        at = p;
    }
    chunks.push(&data[at..]);
    let split = frames(&chunks);
    // Frames found before the stream stopped agree however the bytes were cut.
    let n = whole.0.len().min(split.0.len());
    assert_eq!(whole.0[..n], split.0[..n]);
});
