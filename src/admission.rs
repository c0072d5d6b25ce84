//! TODO module
