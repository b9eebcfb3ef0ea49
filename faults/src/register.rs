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
//! Protocol, one line each way: `W <worker> <grant> <token|->` answers `OK`
//! or `REJECT <highest>`; `R` answers the counter; `S <value>` sets it and
//! answers `OK`. The register stamps every write on the shared clock, so the
//! analysis sees the order in which the resource saw them.

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
    /// False: rejected, its token was lower than the highest seen.
    pub accepted: bool,
}

#[derive(Debug, Default)]
struct State {
    highest: Option<u64>,
    writes: Vec<RegisterWrite>,
    counter: u64,
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

    /// The counter's value now.
    pub fn counter(&self) -> u64 {
        self.lock().counter
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
        ["W", worker, grant, token] => {
            let (Ok(worker), Ok(grant)) = (worker.parse(), grant.parse()) else {
                return format!("ERR bad write {line:?}\n");
            };
            let token = token.parse::<u64>().ok();
            let accepted = match (token, state.highest) {
                (Some(token), Some(highest)) => token >= highest,
                _ => true,
            };
            if accepted && token.is_some() {
                state.highest = token;
            }
            state.writes.push(RegisterWrite {
                at: now_ns(),
                worker,
                grant,
                token,
                accepted,
            });
            match (accepted, state.highest) {
                (false, Some(highest)) => format!("REJECT {highest}\n"),
                _ => "OK\n".to_owned(),
            }
        }
        ["R"] => format!("{}\n", state.counter),
        ["S", value] => match value.parse() {
            Ok(value) => {
                state.counter = value;
                "OK\n".to_owned()
            }
            Err(_) => format!("ERR bad value {value:?}\n"),
        },
        _ => format!("ERR unknown command {line:?}\n"),
    }
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

    /// A fenced write for `grant` carrying `token`: true if accepted.
    pub async fn write(&mut self, grant: u64, token: Option<u64>) -> std::io::Result<bool> {
        let token = token.map_or_else(|| "-".to_owned(), |token| token.to_string());
        let reply = self
            .call(format!("W {} {grant} {token}\n", self.worker))
            .await?;
        match reply.as_str() {
            "OK" => Ok(true),
            rejected if rejected.starts_with("REJECT") => Ok(false),
            other => Err(std::io::Error::other(format!("register: {other}"))),
        }
    }

    /// Reads the unfenced counter.
    pub async fn read_counter(&mut self) -> std::io::Result<u64> {
        let reply = self.call("R\n".to_owned()).await?;
        reply
            .parse()
            .map_err(|_| std::io::Error::other(format!("register: {reply}")))
    }

    /// Sets the unfenced counter.
    pub async fn set_counter(&mut self, value: u64) -> std::io::Result<()> {
        match self.call(format!("S {value}\n")).await?.as_str() {
            "OK" => Ok(()),
            other => Err(std::io::Error::other(format!("register: {other}"))),
        }
    }
}
