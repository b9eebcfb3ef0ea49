//! `distlock completions` and `distlock man`: documents generated from the
//! clap definitions in `cli.rs`, so they cannot drift from the flags.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::exit;

/// Writes the completion script for `shell` to stdout.
pub(crate) fn completions(shell: clap_complete::Shell) -> u8 {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "distlock", &mut script);
    write_stdout(&script)
}

/// Writes the man page of distlock, or of one of its subcommands
/// (`distlock-run(1)`), to stdout in roff.
pub(crate) fn man(subcommand: Option<&str>) -> u8 {
    let mut command = Cli::command();
    command.build();
    let page = match subcommand {
        None => command,
        Some(name) => match command.find_subcommand(name) {
            Some(found) if !found.is_hide_set() => found.clone().name(format!("distlock-{name}")),
            _ => {
                let known: Vec<&str> = command
                    .get_subcommands()
                    .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
                    .map(|sub| sub.get_name())
                    .collect();
                eprintln!(
                    "distlock: no subcommand {name:?}; pages exist for: {}",
                    known.join(", ")
                );
                return exit::USAGE;
            }
        },
    };
    let mut roff = Vec::new();
    if let Err(error) = clap_mangen::Man::new(page).render(&mut roff) {
        eprintln!("distlock: cannot render the man page: {error}");
        return exit::SOFTWARE;
    }
    write_stdout(&roff)
}

/// Writes `bytes` to stdout; a closed pipe (`distlock man | head`) is not
/// an error worth a message, any other failure is.
fn write_stdout(bytes: &[u8]) -> u8 {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(error) => {
            eprintln!("distlock: cannot write to stdout: {error}");
            exit::SOFTWARE
        }
    }
}
