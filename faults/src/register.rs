//! The downstream resource the workers protect: a **fenced register** and an
//! **unfenced counter**, served by the orchestrator on a loopback port.
//!
//! The register is what a fencing token is for (Kleppmann, "How to do
//! distributed locking", 2016): it remembers the highest token it has seen
//! and rejects a write carrying a lower one, so a holder that lost its lock
//! without knowing (paused past its ttl, cut off) cannot overwrite the work
//! of the holder after it. A write without a token (a backend with none) is
//! always accepted. The counter is updated read-sleep-write with no token:
//! two holders at once lose an increment, which is what a lock without
//! fencing protects against only while it is exclusive.
//!
//! Both are kept **per permit** for the semaphore workload: each permit of
//! a semaphore is a lock of its own, with its own fencing tokens (they
//! increase per permit key, not across the semaphore), so the register keeps
//! the highest token per permit, as a resource that fences a semaphore's
//! holders must (`distlock::semaphore`), and a counter per permit, which two
//! holders of *different* permits may update at once without losing
//! anything. The other workloads write to the one unnamed register (`-`).
//!
//! Protocol, one line each way: `W <worker> <grant> <token|-> <permit|->`
//! answers `OK` or `REJECT <highest>`; `R <permit|->` answers that permit's
//! counter; `S <permit|-> <value>` sets it and answers `OK`. The register
//! stamps every write on the shared clock, so the analysis sees the order in
//! which the resource saw them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::events::now_ns;

/// One write the register received.
#[derive(Debug, Clone, Serialize)]
pub struct RegisterWrite {
    /// When the register handled it ([`now_ns`]).
    pub at: u64,
    pub worker: u32,
    pub grant: u64,
    pub token: Option<u64>,
    /// The semaphore permit written to; `None`: the one unnamed register.
    pub permit: Option<u32>,
    /// False: rejected, its token was lower than the highest seen for the
    /// same permit.
    pub accepted: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The highest token accepted, per permit.
    highest: BTreeMap<Option<u32>, u64>,
    writes: Vec<RegisterWrite>,
    /// The unfenced counters, per permit.
    counters: BTreeMap<Option<u32>, u64>,
}

/// The register server; it stops accepting when dropped (open connections
/// end with their workers).
#[derive(Debug)]
pub struct Register {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl Register {
    /// Listens on a free loopback port.
    pub fn start() -> std::io::Result<Register> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Ok(Register { port, state })
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every write so far, in the order the register handled them.
    pub fn writes(&self) -> Vec<RegisterWrite> {
        self.lock().writes.clone()
    }

    /// The counters' values now, summed over the permits (each counter
    /// only loses increments, so the sum falls short of the increments made
    /// by exactly the increments lost).
    pub fn counter(&self) -> u64 {
        self.lock().counters.values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let reply = handle(&line, state);
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn handle(line: &str, state: &Mutex<State>) -> String {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["W", worker, grant, token, permit] => {
            let (Ok(worker), Ok(grant), Ok(permit)) =
                (worker.parse(), grant.parse(), parse_permit(permit))
            else {
                return format!("ERR bad write {line:?}\n");
            };
            let token = token.parse::<u64>().ok();
            let highest = state.highest.get(&permit).copied();
            let accepted = match (token, highest) {
                (Some(token), Some(highest)) => token >= highest,
                _ => true,
            };
            if let (true, Some(token)) = (accepted, token) {
                state.highest.insert(permit, token);
            }
            state.writes.push(RegisterWrite {
                at: now_ns(),
                worker,
                grant,
                token,
                permit,
                accepted,
            });
            match (accepted, highest) {
                (false, Some(highest)) => format!("REJECT {highest}\n"),
                _ => "OK\n".to_owned(),
            }
        }
        ["R", permit] => match parse_permit(permit) {
            Ok(permit) => format!("{}\n", state.counters.get(&permit).copied().unwrap_or(0)),
            Err(()) => format!("ERR bad permit {permit:?}\n"),
        },
        ["S", permit, value] => match (parse_permit(permit), value.parse()) {
            (Ok(permit), Ok(value)) => {
                state.counters.insert(permit, value);
                "OK\n".to_owned()
            }
            _ => format!("ERR bad set {line:?}\n"),
        },
        _ => format!("ERR unknown command {line:?}\n"),
    }
}

/// `-` (the unnamed register) or a permit's number.
fn parse_permit(word: &str) -> Result<Option<u32>, ()> {
    match word {
        "-" => Ok(None),
        number => number.parse().map(Some).map_err(|_| ()),
    }
}

/// How a permit travels in the protocol (see [`parse_permit`]).
fn permit_word(permit: Option<u32>) -> String {
    permit.map_or_else(|| "-".to_owned(), |permit| permit.to_string())
}

/// A worker's connection to the register.
#[derive(Debug)]
pub struct RegisterClient {
    reader: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    worker: u32,
}

impl RegisterClient {
    /// Connects to the register at `address`.
    pub async fn connect(address: &str, worker: u32) -> std::io::Result<RegisterClient> {
        let stream = tokio::net::TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        Ok(RegisterClient {
            reader: tokio::io::BufReader::new(reader),
            writer,
            worker,
        })
    }

    async fn call(&mut self, request: String) -> std::io::Result<String> {
        self.writer.write_all(request.as_bytes()).await?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply).await? == 0 {
            return Err(std::io::Error::other("the register closed the connection"));
        }
        Ok(reply.trim_end().to_owned())
    }

    /// A fenced write for `grant` (of `permit`) carrying `token`: true if
    /// accepted.
    pub async fn write(
        &mut self,
        grant: u64,
        token: Option<u64>,
        permit: Option<u32>,
    ) -> std::io::Result<bool> {
        let token = token.map_or_else(|| "-".to_owned(), |token| token.to_string());
        let reply = self
            .call(format!(
                "W {} {grant} {token} {}\n",
                self.worker,
                permit_word(permit)
            ))
            .await?;
        match reply.as_str() {
            "OK" => Ok(true),
            rejected if rejected.starts_with("REJECT") => Ok(false),
            other => Err(std::io::Error::other(format!("register: {other}"))),
        }
    }

    /// Reads `permit`'s unfenced counter.
    pub async fn read_counter(&mut self, permit: Option<u32>) -> std::io::Result<u64> {
        let reply = self.call(format!("R {}\n", permit_word(permit))).await?;
        reply
            .parse()
            .map_err(|_| std::io::Error::other(format!("register: {reply}")))
    }

    /// Sets `permit`'s unfenced counter.
    pub async fn set_counter(&mut self, permit: Option<u32>, value: u64) -> std::io::Result<()> {
        match self
            .call(format!("S {} {value}\n", permit_word(permit)))
            .await?
            .as_str()
        {
            "OK" => Ok(()),
            other => Err(std::io::Error::other(format!("register: {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lower_token_is_rejected_an_equal_one_and_tokenless_writes_are_not() {
        let register = Register::start().expect("start the register");
        let mut old = RegisterClient::connect(&register.address(), 0)
            .await
            .expect("connect worker 0");
        let mut new = RegisterClient::connect(&register.address(), 1)
            .await
            .expect("connect worker 1");
        assert!(old.write(1, Some(4), None).await.expect("write"));
        assert!(new.write(1, Some(5), None).await.expect("write"));
        assert!(
            new.write(1, Some(5), None).await.expect("write"),
            "same grant, same token"
        );
        assert!(
            !old.write(1, Some(4), None).await.expect("write"),
            "a stale token"
        );
        assert!(
            old.write(1, None, None).await.expect("write"),
            "no token: unfenced"
        );
        let writes = register.writes();
        let accepted: Vec<bool> = writes.iter().map(|write| write.accepted).collect();
        assert_eq!(accepted, [true, true, true, false, true]);
        assert!(writes.windows(2).all(|pair| pair[0].at <= pair[1].at));
    }

    #[tokio::test]
    async fn each_permit_is_fenced_by_its_own_highest_token() {
        let register = Register::start().expect("start the register");
        let mut client = RegisterClient::connect(&register.address(), 0)
            .await
            .expect("connect");
        assert!(client.write(1, Some(9), Some(0)).await.expect("write"));
        assert!(
            client.write(2, Some(3), Some(1)).await.expect("write"),
            "permit 1's tokens are its own: 3 is its highest so far"
        );
        assert!(
            !client.write(3, Some(2), Some(1)).await.expect("write"),
            "below permit 1's highest"
        );
        assert!(
            client.write(4, Some(1), None).await.expect("write"),
            "the unnamed register has seen no token"
        );
        let permits: Vec<Option<u32>> =
            register.writes().iter().map(|write| write.permit).collect();
        assert_eq!(permits, [Some(0), Some(1), Some(1), None]);
    }

    #[tokio::test]
    async fn the_counters_are_read_and_set_without_any_check_one_per_permit() {
        let register = Register::start().expect("start the register");
        let mut client = RegisterClient::connect(&register.address(), 0)
            .await
            .expect("connect");
        assert_eq!(client.read_counter(None).await.expect("read"), 0);
        client.set_counter(None, 7).await.expect("set");
        client.set_counter(None, 3).await.expect("set");
        assert_eq!(client.read_counter(None).await.expect("read"), 3);
        client.set_counter(Some(1), 5).await.expect("set");
        assert_eq!(client.read_counter(Some(0)).await.expect("read"), 0);
        assert_eq!(client.read_counter(Some(1)).await.expect("read"), 5);
        assert_eq!(register.counter(), 8, "the sum over the permits");
    }
}
