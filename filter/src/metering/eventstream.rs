//! AWS's event stream framing (`application/vnd.amazon.eventstream`), in which Bedrock's
//! `ConverseStream` sends its events: binary messages, each a 12-byte prelude (total
//! length, headers' length, the prelude's CRC-32, big-endian), headers, a payload and the
//! message's CRC-32. Each payload (a JSON value: `metadata`'s carries the usage) is handed
//! to the JSON scanner as a value of its own, byte runs as they arrive, never gathered.
//!
//! The CRCs are checked as AWS's SDKs check them: a client stops reading at a message whose
//! CRC fails, so what the meter read of it is not what the client read. That, a length no
//! message can have, or a body that ends inside a message, breaks the framing: the reading
//! is not trusted.

use super::json::Scanner;
use super::utf8::Utf8;
use crc32fast::Hasher;

/// A prelude's length, and the CRC that ends a message.
const PRELUDE: usize = 12;
const CRC: usize = 4;
/// The largest message AWS sends (16 MiB of payload, 128 KiB of headers), with room.
const MAX_MESSAGE: u32 = 17 << 20;

/// Where in a message the framing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// In its prelude: how many of its bytes were read, and those bytes.
    Prelude(u8, [u8; PRELUDE]),
    /// In its headers: bytes left, then the payload's length.
    Headers(u32, u32),
    /// In its payload: bytes left.
    Payload(u32),
    /// In its CRC: how many of its bytes were read, and those bytes.
    Crc(u8, [u8; CRC]),
    /// A length no message can have, or a CRC that failed: nothing more is read.
    Broken,
}

/// Before a message.
const START: At = At::Prelude(0, [0; PRELUDE]);

#[derive(Debug)]
pub(super) struct Frames {
    at: At,
    /// The CRC of the message so far (a hasher goes on from one).
    crc: u32,
}

impl Frames {
    pub(super) fn new() -> Frames {
        Frames { at: START, crc: 0 }
    }

    /// The next bytes of the body: payloads to `json`, and to `text`, which checks them
    /// as UTF-8 (the rest is binary), each payload whole.
    pub(super) fn feed(&mut self, mut bytes: &[u8], json: &mut Scanner, text: &mut Utf8) {
        while let Some((&b, rest)) = bytes.split_first() {
            self.at = match self.at {
                At::Broken => return,
                At::Prelude(got, mut prelude) => {
                    bytes = rest;
                    if let Some(slot) = prelude.get_mut(usize::from(got)) {
                        *slot = b;
                    }
                    match usize::from(got) + 1 {
                        PRELUDE => self.message(prelude),
                        next => At::Prelude(next as u8, prelude),
                    }
                }
                At::Headers(left, payload) => {
                    let run = self.take(left, &mut bytes);
                    match left - run.len() as u32 {
                        0 => after_headers(payload),
                        left => At::Headers(left, payload),
                    }
                }
                At::Payload(left) => {
                    let run = self.take(left, &mut bytes);
                    text.feed(run);
                    if !json.failed() {
                        json.feed(run);
                    }
                    match left - run.len() as u32 {
                        0 => At::Crc(0, [0; CRC]),
                        left => At::Payload(left),
                    }
                }
                At::Crc(got, mut crc) => {
                    bytes = rest;
                    if let Some(slot) = crc.get_mut(usize::from(got)) {
                        *slot = b;
                    }
                    match usize::from(got) + 1 {
                        CRC => {
                            // The message ends, and with it its payload's value.
                            text.end();
                            json.finish();
                            json.reset();
                            match self.crc == u32::from_be_bytes(crc) {
                                true => START,
                                false => At::Broken,
                            }
                        }
                        next => At::Crc(next as u8, crc),
                    }
                }
            };
        }
    }

    /// Up to `n` bytes off the front of `bytes`, counted into the message's CRC.
    fn take<'a>(&mut self, n: u32, bytes: &mut &'a [u8]) -> &'a [u8] {
        let (run, rest) = bytes.split_at(bytes.len().min(n as usize));
        *bytes = rest;
        let mut crc = Hasher::new_with_initial(self.crc);
        crc.update(run);
        self.crc = crc.finalize();
        run
    }

    /// The prelude read: where its lengths lead, if its CRC holds.
    fn message(&mut self, prelude: [u8; PRELUDE]) -> At {
        let [t0, t1, t2, t3, h0, h1, h2, h3, c0, c1, c2, c3] = prelude;
        let total = u32::from_be_bytes([t0, t1, t2, t3]);
        let headers = u32::from_be_bytes([h0, h1, h2, h3]);
        if crc32fast::hash(&prelude[..8]) != u32::from_be_bytes([c0, c1, c2, c3]) {
            return At::Broken;
        }
        let overhead = (PRELUDE + CRC) as u32;
        if total < overhead || total > MAX_MESSAGE || headers > total - overhead {
            return At::Broken;
        }
        self.crc = crc32fast::hash(&prelude);
        match headers {
            0 => after_headers(total - overhead),
            headers => At::Headers(headers, total - overhead - headers),
        }
    }

    /// Whether the framing held: every length possible, every CRC right, and the body
    /// ended between messages.
    pub(super) fn whole(&self) -> bool {
        self.at == START
    }
}

/// Past a message's headers: its payload, if it has one, else its CRC.
fn after_headers(payload: u32) -> At {
    match payload {
        0 => At::Crc(0, [0; CRC]),
        left => At::Payload(left),
    }
}

#[cfg(test)]
#[path = "eventstream_tests.rs"]
mod tests;
