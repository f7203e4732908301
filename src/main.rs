//! The `leaderd` command.

fn main() {}
