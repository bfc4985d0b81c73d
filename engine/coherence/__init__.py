"""coherence"""
