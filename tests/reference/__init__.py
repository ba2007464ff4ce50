"""Transcriptions of other projects' code that seedcli's ports are checked against (tests only, never imported by seedcli)."""
