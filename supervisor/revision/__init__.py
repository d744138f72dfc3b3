"""revision"""
