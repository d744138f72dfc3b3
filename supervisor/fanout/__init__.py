"""fanout"""
