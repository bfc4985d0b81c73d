"""carl_tui"""
