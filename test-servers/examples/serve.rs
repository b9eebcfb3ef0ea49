//! Starts private servers on free loopback ports for measurements by hand
//! (`distlock bench` against each), prints one `NAME URL` line per server,
//! and keeps them running until stdin closes or this process is killed;
//! they die with it ([`test_servers::spawn_tied_to_this_process`]).
//!
//! ```sh
//! cargo run -p test-servers --example serve -- postgres mysql redis etcd zookeeper
//! ```

use std::io::{Read, Write};

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        eprintln!("usage: serve postgres|mysql|redis|etcd|zookeeper|zookeeper-ensemble...");
        std::process::exit(64);
    }
    // Kept until the end: dropping a server stops it.
    let mut servers: Vec<Box<dyn std::any::Any>> = Vec::new();
    for name in &names {
        let url = match name.as_str() {
            "postgres" => keep(&mut servers, test_servers::PostgresServer::start(), |s| {
                s.url()
            }),
            "mysql" | "mariadb" => keep(&mut servers, test_servers::MariaDbServer::start(), |s| {
                s.url()
            }),
            "redis" => keep(&mut servers, test_servers::RedisServer::start(), |s| {
                s.url()
            }),
            "etcd" => keep(&mut servers, test_servers::EtcdServer::start(), |s| s.url()),
            "zookeeper" => keep(&mut servers, test_servers::ZooKeeperServer::start(), |s| {
                s.url()
            }),
            "zookeeper-ensemble" => keep(
                &mut servers,
                test_servers::ZooKeeperEnsemble::start(3),
                |s| s.url(),
            ),
            other => {
                eprintln!("serve: unknown server {other:?}: postgres, mysql, redis, etcd, zookeeper or zookeeper-ensemble");
                std::process::exit(64);
            }
        };
        println!("{name} {url}");
    }
    let _ = std::io::stdout().flush();
    // Block until stdin closes (Ctrl-D, or the caller's pipe ends).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Keeps `server` alive in `servers` and returns its URL.
fn keep<S: 'static>(
    servers: &mut Vec<Box<dyn std::any::Any>>,
    server: S,
    url: impl Fn(&S) -> String,
) -> String {
    let url = url(&server);
    servers.push(Box::new(server));
    url
}
