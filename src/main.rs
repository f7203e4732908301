//! The `leaderd` command.

fn main() {
    // The guard (`leaderd __guard`, started by leaderd itself) runs before
    // anything else: no async runtime, no threads.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| leaderd::guard::is_subcommand(&a))
    {
        std::process::exit(leaderd::guard::main());
    }
}
