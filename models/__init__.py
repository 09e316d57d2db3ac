"""The Show, Attend and Tell model: encoders, attention layers, decoder, losses and decoding graphs.

Pure Keras 3 (TensorFlow backend); knows nothing about pipelines or serving.
"""
