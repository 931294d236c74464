//! Default model fetch (being written).
