//! The ZooKeeper backend against real servers (behaviour under faults,
//! interop with kazoo): one binary, a module per concern.
